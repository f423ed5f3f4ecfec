"""What an alarm's action does, carried out on the head node, inside the run ledger actor.

    FleetHead._emit(alarm)  -> FleetActions.on_alarm: ActionPlanner.decide (fleet/actions.py)
      log        nothing more (as without actions)
      diagnose   a thread: py-spy dumps the named ranks' stacks, on their nodes, into the fleet
                 record (stacks.jsonl); then the chain's next action
      reattempt  an order: every rank of the attempt reads it at its next check and raises
                 `FleetReattemptError`, so the group fails through Ray's own path and
                 `FailureConfig` restarts it; a rank that cannot reach a check (a hang) has its
                 worker actor killed, which Ray's poll sees as a worker failure
      evict      the named ranks' nodes are kept out of the run's later worker groups
                 (`evict_scope="run"`, the default: `excluded_nodes`, which the controller's
                 callback turns into a label selector, head/placement_callback.py) or drained
                 for the whole cluster (`"cluster"`: seams/ray_train.py `drain_node`), then the
                 same order as `reattempt`: the restarted group goes to other nodes. Bounded:
                 never the head node or the driver's node, at most `max_evict_nodes` nodes, never
                 when the cluster would have no room left for the group (each of these restarts
                 the group instead, and says why), and an alarm that names every rank (a
                 collective hang) diagnoses and reattempts instead; a drain Ray refuses leaves
                 the alarm logging, with Ray's reason
      stop       the same order with `FleetStopError`; the controller's `after_exception`
                 (head/ledger_callback.py) asks `stop_message` and raises it there, which Ray
                 does not retry; the driver raises it after the record is closed. The stop holds
                 for every later attempt, in case Ray restarted the group before it was heard
    a new attempt starts -> the action's outcome line, with the seconds from the alarm, the run
                            step the group resumed at and the checkpoint it resumed from
    a rank restarts      -> `resume_from`: the checkpoint a `divergence` or `nonfinite` reattempt
                            chose, when it is not Ray's latest and still in storage
                            (worker/resume.py reads it); a restart nobody ordered: Ray's latest

Alarms that come together get one decision, the most severe (fleet/actions.py). An evict and a
diagnose call out (Ray's GCS, py-spy on the nodes): they run on one action thread of their own,
each call with a deadline, never on the caller's thread (the ledger's event loop, the hang
watch); a check's conclusion waits for an evict's order at most EVICT_SETTLE_S. When the fit
ends, an action still under way is dropped and said `not carried out`. Every failure here (no
checkpoint before the damage, a worker actor unknown, py-spy missing or refused) is written as
the action's outcome, and the alarm only logs: an action never crashes or hangs the fit.

Hooks relied on: `ray.nodes()` (the head node's resource, seams/ray_train.py), Ray's GCS drain
(seams/ray_train.py), `ray.kill` on a Ray Train worker actor (its handle from
`ray.get_runtime_context().current_actor` on the worker), `ray.remote` tasks with
`NodeAffinitySchedulingStrategy`, py-spy's `dump --pid` command line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray

from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.fleet.actions import DAMAGE_KINDS, RESTARTS, ActionPlanner, CheckpointBook, fall_back
from ray_ormas._internal.seams.ray_train import drain_node, head_node_resource

logger = get_logger("ray_ormas.fleet")
STACK_TIMEOUT_S = 30.0  # py-spy's dump of one rank
STACKS_BOUND_S = STACK_TIMEOUT_S + 15  # every named rank's dump, in parallel; later ones are cancelled
DRAIN_TIMEOUT_S = 10.0  # Ray's GCS answering a drain (evict_scope="cluster")
ACTION_WAIT_S = STACKS_BOUND_S + DRAIN_TIMEOUT_S + 5  # the longest the fit's end waits for an action under way
EVICT_SETTLE_S = DRAIN_TIMEOUT_S + 5  # the longest a check's conclusion waits for its evict's order
STACK_CHARS = 20_000  # at most this much of one rank's stacks is kept


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
class RankHandle:
    """Where one rank of an attempt runs: its Ray Train worker actor, node and process."""

    rank: int
    actor: Any
    node_id: str
    node: str
    pid: int


class FleetActions:
    """One fit's actions (see the module docstring). Called under the fleet head's lock;
    `write(name, lines)` appends to the fleet record and says each action line once."""

    def __init__(
        self,
        settings: FleetSettings,
        write: Callable[[str, list[dict[str, Any]]], None],
        driver_node: str | None = None,
        shape: GroupShape | None = None,
    ) -> None:
        self._settings = settings
        self._planner = ActionPlanner(settings)
        self._driver_node = driver_node
        self._shape = shape
        self._excluded: dict[str, str] = {}  # node id -> name: kept out of this run's later groups
        self.book = CheckpointBook()
        self._write = write
        self._ranks: dict[int, dict[int, RankHandle]] = {}  # attempt -> rank -> where it runs
        self._orders: dict[int, dict[str, Any]] = {}  # attempt -> the order its ranks read
        self._waiting: list[dict[str, Any]] = []  # restarts waiting for the next attempt
        self._stop: str | None = None
        self._stop_order: tuple[int, dict[str, Any]] | None = None  # (attempt, order) of a `stop`
        self._resumed: str | None = None  # the checkpoint the last restart was told to resume from
        self._after_damage: set[int] = set()  # ids of the restarts ordered after a divergence or NaN
        # Evicts and diagnoses call out (Ray's GCS, py-spy on a node): one at a time, on a thread
        # of their own, never on the caller's (the ledger's event loop, the hang watch).
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-ormas-fleet-action")
        self._under_way: list[Future[None]] = []
        self._in_flight: dict[int, dict[str, Any]] = {}  # action id -> its line, while on the action thread
        self._closed = threading.Event()  # the fit ended: nothing more is carried out or written
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ what the head tells it
    def rank_joined(self, attempt: int, handle: RankHandle) -> None:
        with self._lock:
            self._ranks.setdefault(attempt, {})[handle.rank] = handle

    def order_for(self, attempt: int) -> dict[str, Any] | None:
        """What the ranks of `attempt` must do at their next check (None: go on). A `stop` holds
        for every later attempt too: if the controller could not hear it in time and Ray restarted
        the group, the new attempt's ranks raise it at their first check."""
        with self._lock:
            if self._stop_order is not None and attempt >= self._stop_order[0]:
                return self._stop_order[1]
            return self._orders.get(attempt)

    def stop_message(self) -> str | None:
        """The `FleetStopError` message once a `stop` action was ordered (asked by the controller
        after an attempt failed)."""
        return self._stop

    def excluded_nodes(self) -> list[str]:
        """The nodes (hex ids) a run-scoped evict keeps this run's later worker groups off."""
        with self._lock:
            return sorted(self._excluded)

    def resume_from(self) -> Any:
        """The checkpoint a restart resumes from when it is not Ray's latest (else None): only a
        restart the fleet ordered after damage has one (a restart nobody ordered resumes where
        Ray would). A chosen checkpoint that is gone from storage (`num_to_keep` may have deleted
        it) is said on the action's line, and the restart resumes from Ray's latest."""
        with self._lock:
            ordered = [w for w in self._waiting if w["id"] in self._after_damage]
            chosen = self.book.resume_override() if ordered else None  # judged now: Ray may have registered more
            if chosen is None:
                self._resumed = None
                return None
            line = ordered[-1]
        gone = _gone(chosen)
        if gone is not None:
            self._write("actions", [{"event": "outcome", "id": line["id"], "reason": gone}])
            chosen = None
        with self._lock:
            self._resumed = _path(chosen) if chosen is not None else None
        return chosen

    def attempt_started(self, attempt: int, run_step: int | None = None) -> None:
        """A new attempt's rank 0 is training, from `run_step`: the restarts that led to it are
        done (their outcome says where the group resumed: Ray's latest checkpoint may have
        moved on between the alarm and the restart)."""
        with self._lock:
            done = [w for w in self._waiting if w["action"] in RESTARTS and (w.get("attempt") or 0) < attempt]
            self._waiting = [w for w in self._waiting if w not in done]
            resumed, self._resumed = self._resumed, None
        now = time.time()
        lines = []
        with self._lock:  # what the group resumed from: the fleet's choice, or Ray's latest at its run step
            loaded = resumed or (_path(self.book.at_run_step(run_step)) if run_step else None)
        for line in done:
            outcome = {"event": "outcome", "id": line["id"], "outcome": "done", "seconds": round(now - line["time"], 1)}
            if run_step is not None:
                outcome["resumed_run_step"] = run_step
            if loaded is not None:
                outcome["resumed_from"] = loaded
            lines.append(outcome)
        self._write("actions", lines)

    def finished(self, stopped: bool = False) -> None:
        """The fit ended (`stopped`: with the `FleetStopError` of a `stop`, as the driver saw it):
        orders no rank read are said as such, and an action still under way is dropped (it
        neither carries out the rest of its chain nor writes)."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            left, self._waiting = self._waiting, []
            stuck, self._in_flight = list(self._in_flight.values()), {}
        cut = f"the fit ended while the action was under way (its end waited {ACTION_WAIT_S:g} s for it)"
        self._write(
            "actions",
            [_final_outcome(line, stopped) for line in left]
            + [{"event": "outcome", "id": line["id"], "outcome": "not carried out", "reason": cut} for line in stuck],
        )

    # ------------------------------------------------------------------ alarms
    def on_alarms(self, alarms: list[dict[str, Any]]) -> list[Future[None]]:
        """Alarms that came together (one check's, or one alarm): the most severe one's action is
        carried out, every other one's line says it was superseded (fleet/actions.py). Returns
        the evict now under way on the action thread, if any (`settle` waits for it)."""
        decided = self._planner.decide_check([self._within_reach(a) for a in alarms])
        evicting: list[Future[None]] = []
        for line, alarm in decided:
            if line["outcome"] == "requested":
                evicting += self._act(line, alarm)
            else:
                self._write("actions", [line])
        return evicting

    def settle(self, evicting: list[Future[None]]) -> None:
        """Wait (at most EVICT_SETTLE_S) for an evict to give its order, so that the ranks read
        it in the answer to this check. Only from a thread that may wait (never the ledger's
        event loop), and without the fleet head's lock."""
        if evicting:
            wait(evicting, timeout=EVICT_SETTLE_S)

    def _within_reach(self, alarm: dict[str, Any]) -> dict[str, Any]:
        """`alarm`, with an evict that would reach every rank (a collective hang names them all)
        turned into a diagnose and a reattempt, and why."""
        chain = self._planner.chain_of(alarm)
        if chain[-1] != "evict":
            return alarm
        with self._lock:
            known = set(self._ranks.get(alarm.get("attempt") or 0, {}))
        named = set(alarm.get("ranks") or [])
        if named and not (known and named >= known):
            return alarm
        why = (
            f"the alarm names every rank ({len(named or known)} of {len(known) or '?'}): an evict would take "
            "every node of the group, so it diagnoses and restarts the group instead"
        )
        return {**alarm, "chain": ["diagnose", "reattempt"], "requested": list(chain), "bounded_by": why}

    def _act(self, line: dict[str, Any], alarm: dict[str, Any]) -> list[Future[None]]:
        if line["action"] in RESTARTS:
            line = self._choose_checkpoint(line)
        self._write("actions", [line])
        if not line["diagnose"] and line["action"] != "evict":
            self._carry_out(line, alarm)  # an order, and for a hang its workers ended: nothing to wait on
            return []
        try:
            with self._lock:
                self._in_flight[line["id"]] = line
            future = self._pool.submit(self._off_the_caller, line, alarm)
        except RuntimeError:  # the fit has ended (the pool is shut down)
            self._outcome(line, "not carried out", "the fit ended before the action could start")
            return []
        self._under_way.append(future)
        return [] if line["diagnose"] else [future]  # stacks take long: their order comes a check later

    def wait_for_actions(self) -> None:
        """The fit ends, or its ranks ended their loop: let the actions under way (stacks being
        captured, an evict) reach the record, at most ACTION_WAIT_S more. Called without the
        fleet head's lock, which an action needs to write."""
        wait(self._under_way, timeout=ACTION_WAIT_S)

    def _choose_checkpoint(self, line: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if line["alarm"] in DAMAGE_KINDS:
                self.book.damaged(line.get("attempt") or 0)
                good = self.book.last_good()
                if good is None:
                    where = self.book.clean_through
                    self._planner.released(line.get("attempt"))
                    return fall_back(
                        line,
                        "no checkpoint was taken before the damage (the last check at which the replicas "
                        f"agreed and every loss was finite: run step {where}); a restart would replay it",
                    )
                step, checkpoint = good
                why = (
                    f"the last checkpoint taken no later than run step {self.book.clean_through}, the last "
                    "check at which every rank's digest agreed and every loss was finite"
                )
                self._after_damage.add(line["id"])  # its restart resumes from the book's choice (resume_from)
                return {**line, "checkpoint": _path(checkpoint), "checkpoint_run_step": step, "why": why}
            latest = self.book.latest()
        if latest is None:
            return {**line, "checkpoint": None, "why": "no checkpoint yet: the group restarts from the start"}
        step, checkpoint = latest
        why = "Ray's latest checkpoint at the alarm (the restart resumes from Ray's latest when it starts)"
        return {**line, "checkpoint": _path(checkpoint), "checkpoint_run_step": step, "why": why}

    def _carry_out(self, line: dict[str, Any], alarm: dict[str, Any]) -> None:
        action, attempt = line["action"], line.get("attempt") or 0
        if action not in RESTARTS + ("stop",):
            return
        evicted = self._evict(line) if action == "evict" else ""
        if evicted is None:  # the drain failed: the alarm only logs (said)
            return
        where = f"rank{'s' if len(line['ranks']) != 1 else ''} {', '.join(map(str, line['ranks'])) or '?'}"
        if line.get("node"):
            where += f" on node {line['node']}"
        said = f"the fleet's {line['alarm']} alarm ({where}, run step {line.get('run_step')}): {alarm.get('message')}"
        if action == "stop":
            message = f"stopped by {said}"
            self._stop = message
        else:
            resume = f"checkpoint at run step {line['checkpoint_run_step']}" if line.get("checkpoint") else "the start"
            message = f"{evicted}restarting the worker group from {resume} after {said}"
        with self._lock:
            self._waiting.append(line)
            order = "reattempt" if action == "evict" else action  # what a rank raises
            self._orders[attempt] = {"action": order, "message": message, "id": line["id"]}
            if action == "stop":
                self._stop_order = (attempt, self._orders[attempt])
        if alarm["kind"] == "hang":  # the stuck ranks cannot read an order: their workers are ended
            self._end_stuck_ranks(line, attempt)

    def _evict(self, line: dict[str, Any]) -> str | None:
        """Keep the line's ranks' nodes out of the run (or drain them, `evict_scope="cluster"`):
        what the restart's message says of it ("" when no node could be evicted and the group
        only restarts, said), or None when Ray refused every drain (the action then falls back
        to logging, said)."""
        with self._lock:
            known = self._ranks.get(line.get("attempt") or 0, {})
            nodes = {known[r].node_id: known[r].node for r in line["ranks"] if r in known}
        if not nodes:
            self._fall_back_to_reattempt(line, "the named ranks' nodes are not known to the head")
            return ""
        try:
            kept = _never_evicted(self._driver_node)
        except Exception as e:  # without it no node is known to be safe to evict
            self._fall_back_to_reattempt(line, f"the head node is not known ({type(e).__name__}: {e})")
            return ""
        refused = [
            f"node {name} is {kept[node_id]}, which is never evicted"
            for node_id, name in nodes.items()
            if node_id in kept
        ]
        chosen = {node_id: name for node_id, name in sorted(nodes.items(), key=lambda n: n[1]) if node_id not in kept}
        if not chosen:
            self._fall_back_to_reattempt(line, "; ".join(refused))
            return ""
        bound = self._settings.max_evict_nodes
        if len(chosen) > bound:
            self._fall_back_to_reattempt(
                line,
                f"the named ranks run on {len(chosen)} nodes, more than max_evict_nodes ({bound}) allows in one evict",
            )
            return ""
        no_room = self._no_room_without(chosen)
        if no_room is not None:
            self._fall_back_to_reattempt(line, no_room)
            return ""
        if self._settings.evict_scope == "run":
            with self._lock:
                self._excluded.update(chosen)
            evicted, how = chosen, "kept out of this run"
        else:
            drained = self._drain(line, chosen, refused)
            if drained is None:
                return None
            evicted, how = drained, "drained for the whole cluster"
        outcome: dict[str, Any] = {
            "event": "outcome",
            "id": line["id"],
            "evicted": list(evicted.values()),
            "evicted_ids": list(evicted),
            "scope": self._settings.evict_scope,
        }
        if refused:
            outcome["reason"] = "; ".join(refused)
        self._write("actions", [outcome])
        named = ", ".join(f"{name} ({node_id[:8]})" for node_id, name in evicted.items())
        return f"evicted node{'s' if len(evicted) > 1 else ''} {named} ({how}); "

    def _no_room_without(self, chosen: dict[str, str]) -> str | None:
        """Why a fixed-size group would find no room once `chosen` (and the nodes evicted before)
        are out, or None when it fits. Counted on the alive nodes' total resources: what other
        runs hold at that moment is not known here."""
        if self._shape is None:
            return None
        with self._lock:
            out = set(self._excluded) | set(chosen)
        try:
            nodes = [resources for node_id, resources in _alive_nodes().items() if node_id not in out]
        except Exception as e:
            return f"the cluster's nodes could not be read ({type(e).__name__}: {e})"
        room = self._shape.room(nodes)
        if room >= self._shape.workers:
            return None
        need = ", ".join(f"{v:g} {k}" for k, v in sorted(self._shape.need.items()))
        return (
            f"without node{'s' if len(chosen) > 1 else ''} {', '.join(chosen.values())} the cluster has room for "
            f"{room} of the group's {self._shape.workers} workers ({need} each): the group would wait for a node "
            "that may never come"
        )

    def _drain(self, line: dict[str, Any], chosen: dict[str, str], refused: list[str]) -> dict[str, str] | None:
        """Drain `chosen` through Ray's GCS; the nodes drained, or None when Ray refused every one
        (the alarm then only logs, said)."""
        drained: dict[str, str] = {}  # node id -> name
        for node_id, name in chosen.items():
            why = f"ray-ormas: {line['alarm']} alarm on ranks {line['ranks']}, run step {line.get('run_step')}"
            try:
                rejection = drain_node(node_id, why, DRAIN_TIMEOUT_S)
            except Exception as e:  # a changed Ray (RaySeamChanged) or an unreachable GCS: said, never the fit's end
                rejection = f"{type(e).__name__}: {e}"
            if rejection is None:
                drained[node_id] = name
            else:
                refused.append(f"Ray refused to drain node {name}: {rejection}")
        if not drained:
            self._planner.released(line.get("attempt"))
            self._write("actions", [{"event": "outcome", "id": line["id"], **fall_back({}, "; ".join(refused))}])
            return None
        return drained

    def _fall_back_to_reattempt(self, line: dict[str, Any], reason: str) -> None:
        logger.warning("fleet action %d: evict falls back to reattempt: %s", line["id"], reason)
        self._write("actions", [{"event": "outcome", "id": line["id"], "action": "reattempt", "reason": reason}])

    def _end_stuck_ranks(self, line: dict[str, Any], attempt: int) -> None:
        with self._lock:
            known = self._ranks.get(attempt, {})
            targets = [known[r] for r in line["ranks"] if r in known] or list(known.values())
        if not targets:
            self._outcome(line, "failed", "the stuck ranks' workers are not known to the head")
            return
        for handle in targets:
            try:
                ray.kill(handle.actor, no_restart=True)
            except Exception as e:  # the order stays: a rank that reaches its check raises it
                self._outcome(line, "failed", f"could not end rank {handle.rank}'s worker: {type(e).__name__}: {e}")

    def _outcome(self, line: dict[str, Any], outcome: str, reason: str) -> None:
        logger.warning("fleet action %s after %s: %s (%s)", line["action"], line["alarm"], outcome, reason)
        self._write("actions", [{"event": "outcome", "id": line["id"], "outcome": outcome, "reason": reason}])

    # ------------------------------------------------------------------ diagnose
    def _off_the_caller(self, line: dict[str, Any], alarm: dict[str, Any]) -> None:
        """On the action thread: the stacks first, when asked, then the action, unless the fit
        has ended meanwhile."""
        try:
            if line["diagnose"]:
                self._diagnose(line)
            if not self._closed.is_set():
                self._carry_out(line, alarm)
        except Exception as e:  # never the fit's end
            if not self._closed.is_set():
                self._outcome(line, "failed", f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._in_flight.pop(line["id"], None)

    def _diagnose(self, line: dict[str, Any]) -> None:
        """py-spy's dumps of the named ranks, taken in parallel on their nodes, into the record."""
        with self._lock:
            known = self._ranks.get(line.get("attempt") or 0, {})
            targets = [known[r] for r in line["ranks"] if r in known]
        stacks = _stacks_of_ranks(targets) if targets else {}
        if self._closed.is_set():
            return
        self._write(
            "stacks", [{"id": line["id"], "rank": h.rank, "node": h.node, "stack": stacks[h.rank]} for h in targets]
        )
        said = (
            f"stacks of ranks {', '.join(str(h.rank) for h in targets)}"
            if targets
            else "no stacks: the named ranks' workers are not known to the head"
        )
        if not targets:
            logger.warning("fleet action %d: %s", line["id"], said)
        done = {"outcome": "done"} if line["action"] == "log" else {}  # a diagnose alone is done here
        self._write("actions", [{"event": "outcome", "id": line["id"], "diagnosed": said, **done}])


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


def _stacks_of_ranks(handles: list[RankHandle]) -> dict[int, str]:
    """rank -> py-spy's dump of its process, run on its node, all at once; the reason when it
    cannot. A dump not back within STACKS_BOUND_S is cancelled."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    said: dict[int, str] = {}
    refs: dict[int, Any] = {}
    for handle in handles:
        try:
            task = _dump.options(scheduling_strategy=NodeAffinitySchedulingStrategy(handle.node_id, soft=False))
            refs[handle.rank] = task.remote(handle.pid)
        except Exception as e:
            said[handle.rank] = f"could not capture the stacks of rank {handle.rank}: {type(e).__name__}: {e}"
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=STACKS_BOUND_S) if refs else ([], [])
    for rank, ref in refs.items():
        if ref not in ready:
            ray.cancel(ref, force=True)
            said[rank] = (
                f"could not capture the stacks of rank {rank}: no answer within {STACKS_BOUND_S:g} s (cancelled)"
            )
            continue
        try:
            said[rank] = str(ray.get(ref))[:STACK_CHARS]
        except Exception as e:
            said[rank] = f"could not capture the stacks of rank {rank}: {type(e).__name__}: {e}"
    return said


@ray.remote(num_cpus=0, max_retries=0)
def _dump(pid: int) -> str:
    """py-spy's `dump` of process `pid` (on this node); its error text when it fails."""
    beside = Path(sys.executable).parent / "py-spy"
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        return "py-spy is not installed on this node (pip install py-spy)"
    done = subprocess.run(
        [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=STACK_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        return f"py-spy could not read process {pid}: {(done.stderr or done.stdout).strip()[-2000:]}"
    return done.stdout


def _gone(checkpoint: Any) -> str | None:
    """Why `checkpoint` cannot be resumed from (it is gone from storage), or None when it is there
    or cannot be looked at (the restart then tries it, and says what it finds)."""
    import pyarrow.fs as pafs

    try:
        info = checkpoint.filesystem.get_file_info(checkpoint.path)
    except Exception:
        return None
    if info.type != pafs.FileType.NotFound:
        return None
    return (
        f"the checkpoint chosen to resume from, {checkpoint.path}, is gone from storage (RunConfig's "
        "CheckpointConfig(num_to_keep) may have deleted it): the restart resumes from Ray's latest instead"
    )


def _final_outcome(line: dict[str, Any], stopped: bool) -> dict[str, Any]:
    if line["action"] == "stop" and stopped:
        return {"event": "outcome", "id": line["id"], "outcome": "done", "reason": "the fit ended with FleetStopError"}
    reason = "the fit ended before the ranks read the order"
    return {"event": "outcome", "id": line["id"], "outcome": "not carried out", "reason": reason}


def _path(checkpoint: Any) -> str | None:
    return getattr(checkpoint, "path", None) if checkpoint is not None else None
