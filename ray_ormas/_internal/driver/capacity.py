"""Can the Ray cluster ever place the workers? Checked on the driver, before Ray Train waits.

Ray Train waits for the resources its workers ask for. On a cluster that can grow (an
autoscaler, KubeRay) that is right. A cluster that ray-ormas itself started on this machine
(`ray-ormas train` without RAY_ADDRESS, or `fit()` when Ray was not initialised) never grows, so
a request larger than it would wait forever, restarting the worker group every
`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`, with no word about why. `check_capacity` compares what
the workers need with what the cluster has, in total and per node (one worker must fit on one
node), and returns the shortfall as one sentence, or None when the workers fit.
`lone_node_eviction` does the same for the fleet's `evict` action, which needs a node other than
the head node (never evicted) to act on.

Hooks relied on: `ray.nodes()` (each node's `Alive` and `Resources`), and `ScalingConfig`'s
public fields with their documented defaults (a worker takes 1 CPU, or 1 GPU with `use_gpu`).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.train import ScalingConfig

from ray_ormas._internal.common.fleet_settings import FleetSettings


def per_worker(scaling: ScalingConfig) -> dict[str, float]:
    """The resources one worker asks for, as Ray Train's ScalingConfig documents them."""
    if scaling.resources_per_worker:
        need = {k: float(v) for k, v in scaling.resources_per_worker.items() if v}
    else:
        need = {"GPU": 1.0} if scaling.use_gpu else {"CPU": 1.0}
    if scaling.use_gpu:
        need.setdefault("GPU", 1.0)
    return need


def check_capacity(scaling: ScalingConfig, *, keys: dict[str, str] | None = None) -> str | None:
    """The reason the cluster can never place `scaling`'s workers, or None if it can.

    `keys` names the options in the caller's words (defaults: the ScalingConfig's fields), so
    the CLI can say `scaling.workers` where the Python API says `ScalingConfig(num_workers=...)`.
    """
    keys = {
        "workers": "ScalingConfig(num_workers=...)",
        "resources": "ScalingConfig(resources_per_worker=...)",
        **(keys or {}),
    }
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    need = per_worker(scaling)
    workers = int(scaling.min_workers)  # an elastic fit starts once its minimum fits
    for resource, amount in sorted(need.items()):
        largest = max((float(n.get(resource, 0)) for n in nodes), default=0.0)
        if amount > largest:
            return (
                f"{keys['resources']}: one worker needs {_amount(amount)} {resource}, and no node of this "
                f"Ray cluster has that many (the largest has {_amount(largest)}); lower it, or run on a "
                f"cluster with bigger nodes"
            )
        fit = sum(int(float(n.get(resource, 0)) // amount) for n in nodes)
        if fit < workers:
            return (
                f"{keys['workers']}: {workers} workers x {_amount(amount)} {resource} need "
                f"{_amount(workers * amount)} {resource}; this Ray cluster has "
                f"{_amount(sum(float(n.get(resource, 0)) for n in nodes))} and room for {fit} such "
                f"worker(s); use at most {fit} workers, or less {resource} per worker "
                f"({keys['resources']}), or a bigger cluster"
            )
    return None


def lone_node_eviction(fleet: FleetSettings | None, *, option: str = "FleetSettings.actions") -> str | None:
    """Why `evict` can never act on this cluster (it has one node, the head node, which is never
    evicted), or None when it can (or no action evicts)."""
    if fleet is None or not fleet.evicts:
        return None
    if sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        return None
    kinds = sorted(kind for kind, chain in fleet.actions.items() if "evict" in chain)
    return (
        f"{option} evicts on {', '.join(kinds)} alarms, and this Ray cluster has one node, the head node, "
        f"which is never evicted (an evict there would only restart the group); use 'reattempt', or run "
        f"on a cluster with worker nodes"
    )


def _amount(x: Any) -> str:
    return f"{float(x):g}"
