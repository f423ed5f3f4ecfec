"""What an `evict` does to nodes, on the head node, inside the run ledger actor: which of the named
ranks' nodes may go, within the bounds, and taking them out of the run (or the cluster).

    FleetActions._evict (head/fleet_actions.py) -> NodeEviction.evict(line, nodes) -> an `Eviction`

Bounds, each of which restarts the group in place instead (`Eviction.fallback` says why): never
the head node (the run ledger, Ray's GCS) or the driver's node; at most
`FleetSettings.max_evict_nodes` nodes; never when a fixed-size group would find no room on the
alive nodes that are left. `evict_scope="run"` (the default) only adds the nodes to
`excluded_nodes`, which the controller's callback turns into a label selector
(head/placement_callback.py): nothing else on the cluster is told. `"cluster"` drains them
through Ray's GCS (seams/ray_train.py `drain_node`, with a deadline); when Ray refuses every
drain, `Eviction.refused` says why and the alarm only logs.

Runs on the fleet's action thread, never on the ledger's event loop: `ray.nodes()` and the drain
call out to Ray's GCS.

Hooks relied on: `ray.nodes()`, the head node's resource and Ray's GCS drain (seams/ray_train.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import ray

from ray_ormas._internal.common.fleet_records import ActionLine
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.seams.ray_train import drain_node, head_node_resource

DRAIN_TIMEOUT_S = 10.0  # Ray's GCS answering a drain (evict_scope="cluster")


@dataclass(frozen=True)
class GroupShape:
    """What a restarted worker group needs: `workers` workers of `need` resources each."""

    need: dict[str, float]
    workers: int

    @classmethod
    def of(cls, spec: Any) -> GroupShape:
        """The shape of a `FleetSpec`'s group (the fewest workers an elastic group starts with)."""
        return cls(dict(spec.worker_need or {"CPU": 1.0}), int(spec.min_workers or spec.world))

    def room(self, nodes: list[dict[str, float]]) -> int:
        """How many of the group's workers `nodes` (each node's total resources) can hold."""
        return sum(
            min((int(float(node.get(k, 0)) // v) for k, v in self.need.items() if v > 0), default=0) for node in nodes
        )


@dataclass(frozen=True)
class Eviction:
    """What an evict did: the nodes it took out (node id -> name), or why it restarts the group in
    place instead (`fallback`), or why the alarm only logs (`refused`: Ray refused every drain);
    `notes`: named nodes that were never evicted, and drains Ray refused, when others went."""

    evicted: dict[str, str] = field(default_factory=dict)
    fallback: str | None = None
    refused: str | None = None
    notes: str | None = None


class NodeEviction:
    """One fit's evicted nodes (see the module docstring)."""

    def __init__(self, settings: FleetSettings, driver_node: str | None, shape: GroupShape | None) -> None:
        self._settings = settings
        self._driver_node = driver_node
        self._shape = shape
        self._excluded: dict[str, str] = {}  # node id -> name: kept out of this run's later groups
        self._lock = threading.Lock()

    def excluded_nodes(self) -> list[str]:
        """The nodes (hex ids) a run-scoped evict keeps this run's later worker groups off."""
        with self._lock:
            return sorted(self._excluded)

    def evict(self, line: ActionLine, nodes: dict[str, str]) -> Eviction:
        """Take `nodes` (node id -> name: the line's ranks' nodes) out, within the bounds."""
        if not nodes:
            return Eviction(fallback="the named ranks' nodes are not known to the head")
        try:
            kept = _never_evicted(self._driver_node)
        except Exception as e:  # without it no node is known to be safe to evict
            return Eviction(fallback=f"the head node is not known ({type(e).__name__}: {e})")
        notes = [f"node {nodes[n]} is {kept[n]}, which is never evicted" for n in nodes if n in kept]
        chosen = {node_id: name for node_id, name in sorted(nodes.items(), key=lambda n: n[1]) if node_id not in kept}
        if not chosen:
            return Eviction(fallback="; ".join(notes))
        bound = self._settings.max_evict_nodes
        if len(chosen) > bound:
            return Eviction(
                fallback=f"the named ranks run on {len(chosen)} nodes, more than max_evict_nodes ({bound}) allows "
                "in one evict"
            )
        no_room = self._no_room_without(chosen)
        if no_room is not None:
            return Eviction(fallback=no_room)
        if self._settings.evict_scope == "run":
            with self._lock:
                self._excluded.update(chosen)
            return Eviction(evicted=chosen, notes="; ".join(notes) or None)
        drained = self._drain(line, chosen, notes)
        if not drained:
            return Eviction(refused="; ".join(notes))
        return Eviction(evicted=drained, notes="; ".join(notes) or None)

    def _no_room_without(self, chosen: dict[str, str]) -> str | None:
        """Why a fixed-size group would find no room once `chosen` (and the nodes evicted before)
        are out, or None when it fits. Counted on the alive nodes' total resources: what other
        runs hold at that moment is not known here."""
        if self._shape is None:
            return None
        with self._lock:
            out = set(self._excluded) | set(chosen)
        try:
            alive = [resources for node_id, resources in _alive_nodes().items() if node_id not in out]
        except Exception as e:
            return f"the cluster's nodes could not be read ({type(e).__name__}: {e})"
        room = self._shape.room(alive)
        if room >= self._shape.workers:
            return None
        need = ", ".join(f"{v:g} {k}" for k, v in sorted(self._shape.need.items()))
        return (
            f"without node{'s' if len(chosen) > 1 else ''} {', '.join(chosen.values())} the cluster has room for "
            f"{room} of the group's {self._shape.workers} workers ({need} each): the group would wait for a node "
            "that may never come"
        )

    def _drain(self, line: ActionLine, chosen: dict[str, str], notes: list[str]) -> dict[str, str]:
        """Drain `chosen` through Ray's GCS: the nodes drained (a refusal is added to `notes`)."""
        drained: dict[str, str] = {}  # node id -> name
        for node_id, name in chosen.items():
            why = f"ray-ormas: {line.alarm} alarm on ranks {list(line.ranks)}, run step {line.run_step}"
            try:
                rejection = drain_node(node_id, why, DRAIN_TIMEOUT_S)
            except Exception as e:  # a changed Ray (RaySeamChanged) or an unreachable GCS: said, never the fit's end
                rejection = f"{type(e).__name__}: {e}"
            if rejection is None:
                drained[node_id] = name
            else:
                notes.append(f"Ray refused to drain node {name}: {rejection}")
        return drained


def _never_evicted(driver_node: str | None) -> dict[str, str]:
    """node id -> why it is never evicted: the head node (the run ledger, Ray's GCS) and the
    driver's node."""
    resource = head_node_resource()
    kept = {n["NodeID"]: "the head node" for n in ray.nodes() if resource in n.get("Resources", {})}
    if driver_node:
        kept.setdefault(driver_node, "the driver's node")
    return kept


def _alive_nodes() -> dict[str, dict[str, float]]:
    """node id -> total resources, of the nodes Ray counts as alive."""
    return {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
