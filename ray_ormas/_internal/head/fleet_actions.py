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
    a check not clean    -> the checkpoint a restart after damage would choose is copied into the
                            record's storage (head/checkpoint_pins.py), when one can be ordered
    a rank restarts      -> `resume_from`: the checkpoint a `divergence` or `nonfinite` reattempt
                            chose, when it is not Ray's latest: from storage, or its copy once
                            `num_to_keep` deleted it (worker/resume.py reads it); a restart nobody
                            ordered: Ray's latest

Alarms that come together get one decision, the most severe (fleet/actions.py). An evict and a
diagnose call out (Ray's GCS, py-spy on the nodes): they run on one action thread of their own,
each call with a deadline, never on the caller's thread (the ledger's event loop, the hang
watch); a check's conclusion waits for an evict's order at most EVICT_SETTLE_S. When the fit
ends, an action still under way is dropped and said `not carried out`. Every failure here (no
checkpoint before the damage, a worker actor unknown, py-spy missing or refused) is written as
the action's outcome, and the alarm only logs: an action never crashes or hangs the fit.

The evict's bounds and its calls to Ray are head/node_eviction.py's; the stacks are
head/rank_stacks.py's. What goes in and out is typed (common/fleet_records.py): `FleetAlarm`s in, `ActionLine`,
`ActionOutcome` and `StackLine` to the record, an `Order` to the ranks.

Hooks relied on: `ray.kill` on a Ray Train worker actor (its handle from
`ray.get_runtime_context().current_actor` on the worker), and what the two modules above rely on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Callable, Sequence

import ray

from ray_ormas._internal.common.fleet_records import ActionLine, ActionOutcome, FleetAlarm, FleetLine, Order, StackLine
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.fleet.actions import DAMAGE_KINDS, RESTARTS, ActionPlanner, CheckpointBook, fall_back
from ray_ormas._internal.head.checkpoint_pins import CheckpointPins
from ray_ormas._internal.head.node_eviction import DRAIN_TIMEOUT_S, GroupShape, NodeEviction
from ray_ormas._internal.head.rank_stacks import STACKS_BOUND_S, RankHandle, stacks_of_ranks

logger = get_logger("ray_ormas.fleet")
ACTION_WAIT_S = STACKS_BOUND_S + DRAIN_TIMEOUT_S + 5  # the longest the fit's end waits for an action under way
EVICT_SETTLE_S = DRAIN_TIMEOUT_S + 5  # the longest a check's conclusion waits for its evict's order
PIN_WAIT_S = 60.0  # the longest the fit's end waits for a checkpoint copy under way (head/checkpoint_pins.py)


class FleetActions:
    """One fit's actions (see the module docstring). Called under the fleet head's lock;
    `write(name, lines)` appends to the fleet record and says each action line once."""

    def __init__(
        self,
        settings: FleetSettings,
        write: Callable[[str, Sequence[FleetLine]], None],
        driver_node: str | None = None,
        shape: GroupShape | None = None,
        pins: CheckpointPins | None = None,
    ) -> None:
        self._settings = settings
        self._planner = ActionPlanner(settings)
        self._eviction = NodeEviction(settings, driver_node, shape)
        self.book = CheckpointBook()
        self._write = write
        self._ranks: dict[int, dict[int, RankHandle]] = {}  # attempt -> rank -> where it runs
        self._orders: dict[int, Order] = {}  # attempt -> the order its ranks read
        self._ended_by: dict[int, tuple[str, float]] = {}  # attempt -> (its alarm and action, the alarm's time)
        self._waiting: list[ActionLine] = []  # restarts waiting for the next attempt
        self._stop: str | None = None
        self._stop_order: tuple[int, Order] | None = None  # (attempt, order) of a `stop`
        self._resumed: str | None = None  # the checkpoint the last restart was told to resume from
        self._after_damage: set[int] = set()  # ids of the restarts ordered after a divergence or NaN
        # Evicts and diagnoses call out (Ray's GCS, py-spy on a node): one at a time, on a thread
        # of their own, never on the caller's (the ledger's event loop, the hang watch).
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-ormas-fleet-action")
        self._under_way: list[Future[None]] = []
        self._in_flight: dict[int, ActionLine] = {}  # action id -> its line, while on the action thread
        self._closed = threading.Event()  # the fit ended: nothing more is carried out or written
        self._lock = threading.RLock()
        # Copies of the checkpoint a restart after damage would resume from, made on a thread of
        # their own while a check is not clean (head/checkpoint_pins.py): num_to_keep cannot take it.
        restarts_after_damage = settings.policy is not None or any(
            settings.action_for(kind)[-1] in RESTARTS for kind in DAMAGE_KINDS
        )
        self._pins = pins if restarts_after_damage else None
        self._pinning = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-ormas-fleet-pin")
        self._pins_asked: set[str] = set()
        self._pins_under_way: list[Future[None]] = []

    # ------------------------------------------------------------------ what the head tells it
    def rank_joined(self, attempt: int, handle: RankHandle) -> None:
        with self._lock:
            self._ranks.setdefault(attempt, {})[handle.rank] = handle

    def order_for(self, attempt: int) -> Order | None:
        """What the ranks of `attempt` must do at their next check (None: go on). A `stop` holds
        for every later attempt too: if the controller could not hear it in time and Ray restarted
        the group, the new attempt's ranks raise it at their first check."""
        with self._lock:
            if self._stop_order is not None and attempt >= self._stop_order[0]:
                return self._stop_order[1]
            return self._orders.get(attempt)

    def restart_cause(self, attempt: int) -> tuple[str, float] | None:
        """(the alarm and the action that ended `attempt`, e.g. "divergence reattempt", and the
        alarm's time), or None when no action ended it (the goodput account's restart cause)."""
        with self._lock:
            return self._ended_by.get(attempt)

    def stop_message(self) -> str | None:
        """The `FleetStopError` message once a `stop` action was ordered (asked by the controller
        after an attempt failed)."""
        return self._stop

    def checked(self, attempt: int, run_step: int, clean: bool) -> None:
        """A complete check (the book's `checked`), and a copy of the checkpoint at risk."""
        with self._lock:
            self.book.checked(attempt, run_step, clean)
        self._keep_at_risk()

    def taken(self, run_step: int, attempt: int, checkpoint: Any) -> None:
        """Ray registered a checkpoint (the book's `taken`), and a copy of the checkpoint at risk."""
        with self._lock:
            self.book.taken(run_step, attempt, checkpoint)
        self._keep_at_risk()

    def _keep_at_risk(self) -> None:
        """While a check is not clean, copy the checkpoint a restart after damage would resume
        from, once (off the caller's thread: it copies files)."""
        if self._pins is None:
            return
        with self._lock:
            at_risk = self.book.at_risk()
            path = _path(at_risk)
            if path is None or path in self._pins_asked or self._closed.is_set():
                return
            self._pins_asked.add(path)
        with contextlib.suppress(RuntimeError):  # the fit has ended (the pool is shut down)
            self._pins_under_way.append(self._pinning.submit(self._pins.pin, at_risk))

    def excluded_nodes(self) -> list[str]:
        """The nodes (hex ids) a run-scoped evict keeps this run's later worker groups off."""
        return self._eviction.excluded_nodes()

    def resume_from(self) -> Any:
        """The checkpoint a restart resumes from when it is not Ray's latest (else None): only a
        restart the fleet ordered after damage has one (a restart nobody ordered resumes where
        Ray would). A chosen checkpoint that is gone from storage (`num_to_keep` may have deleted
        it) is said on the action's line, and the restart resumes from Ray's latest."""
        with self._lock:
            ordered = [w for w in self._waiting if w.id in self._after_damage]
            chosen = self.book.resume_override() if ordered else None  # judged now: Ray may have registered more
            if chosen is None:
                self._resumed = None
                return None
            line = ordered[-1]
        gone = _gone(chosen)
        kept = self._pins.kept(chosen) if gone is not None and self._pins is not None else None
        if kept is not None:
            reason = (
                f"the checkpoint chosen to resume from, {chosen.path}, was deleted (RunConfig's "
                f"CheckpointConfig(num_to_keep)): the restart resumes from the copy kept at {kept.path}"
            )
            self._write("actions", [ActionOutcome(line.id, reason=reason)])
            chosen = kept
        elif gone is not None:
            self._write("actions", [ActionOutcome(line.id, reason=gone)])
            chosen = None
        with self._lock:
            self._resumed = _path(chosen) if chosen is not None else None
        return chosen

    def attempt_started(self, attempt: int, run_step: int | None = None) -> None:
        """A new attempt's rank 0 is training, from `run_step`: the restarts that led to it are
        done (their outcome says where the group resumed: Ray's latest checkpoint may have
        moved on between the alarm and the restart)."""
        with self._lock:
            done = self._restarts_before(attempt)
            resumed, self._resumed = self._resumed, None
            # what the group resumed from: the fleet's choice, or Ray's latest at its run step
            loaded = resumed or (_path(self.book.at_run_step(run_step)) if run_step else None)
        now = time.time()
        self._write(
            "actions",
            [
                ActionOutcome(
                    line.id,
                    outcome="done",
                    seconds=round(now - line.time, 1),
                    resumed_run_step=run_step,
                    resumed_from=loaded,
                )
                for line in done
            ],
        )

    def attempt_screened_out(self, attempt: int) -> None:
        """A new attempt's group started, and its pre-flight screen ordered it to end before its
        first step (an evict or a stop of its own): the restarts that led to it are done, though
        the group trained nothing (no run step it resumed from)."""
        with self._lock:
            done = self._restarts_before(attempt)
        now = time.time()
        why = f"the group restarted (attempt {attempt}); its pre-flight screen ended it before its first step"
        self._write(
            "actions",
            [ActionOutcome(line.id, outcome="done", reason=why, seconds=round(now - line.time, 1)) for line in done],
        )

    def _restarts_before(self, attempt: int) -> list[ActionLine]:
        """The restarts waiting for an attempt after theirs, taken off the waiting list (under the lock)."""
        done = [w for w in self._waiting if w.action in RESTARTS and (w.attempt or 0) < attempt]
        self._waiting = [w for w in self._waiting if w not in done]
        return done

    def finished(self, stopped: bool = False) -> None:
        """The fit ended (`stopped`: with the `FleetStopError` of a `stop`, as the driver saw it):
        orders no rank read are said as such, and an action still under way is dropped (it
        neither carries out the rest of its chain nor writes)."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pinning.shutdown(wait=False, cancel_futures=True)
        if self._pins is not None:  # the restarts have loaded what they resume from
            wait(self._pins_under_way, timeout=PIN_WAIT_S)  # a copy cannot be cut: one still going deletes itself
            self._pins.release()
        with self._lock:
            left, self._waiting = self._waiting, []
            stuck, self._in_flight = list(self._in_flight.values()), {}
        cut = f"the fit ended while the action was under way (its end waited {ACTION_WAIT_S:g} s for it)"
        self._write(
            "actions",
            [_final_outcome(line, stopped) for line in left]
            + [ActionOutcome(line.id, outcome="not carried out", reason=cut) for line in stuck],
        )

    # ------------------------------------------------------------------ alarms
    def on_alarms(self, alarms: list[FleetAlarm]) -> list[Future[None]]:
        """Alarms that came together (one check's, or one alarm): the most severe one's action is
        carried out, every other one's line says it was superseded (fleet/actions.py). Returns
        the evict now under way on the action thread, if any (`settle` waits for it)."""
        decided = self._planner.decide_check([self._within_reach(a) for a in alarms])
        evicting: list[Future[None]] = []
        for line, alarm in decided:
            if line.outcome == "requested":
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

    def _within_reach(self, alarm: FleetAlarm) -> FleetAlarm:
        """`alarm`, with an evict that would reach every rank (a collective hang names them all)
        turned into a diagnose and a reattempt, and why."""
        chain = self._planner.chain_of(alarm)
        if chain[-1] != "evict":
            return alarm
        with self._lock:
            known = set(self._ranks.get(alarm.attempt or 0, {}))
        named = set(alarm.ranks)
        if named and not (known and named >= known):
            return alarm
        why = (
            f"the alarm names every rank ({len(named or known)} of {len(known) or '?'}): an evict would take "
            "every node of the group, so it diagnoses and restarts the group instead"
        )
        return replace(alarm, chain=("diagnose", "reattempt"), requested=chain, bounded_by=why)

    def _act(self, line: ActionLine, alarm: FleetAlarm) -> list[Future[None]]:
        if line.action in RESTARTS:
            line = self._choose_checkpoint(line)
        self._write("actions", [line])
        if not line.diagnose and line.action != "evict":
            self._carry_out(line, alarm)  # an order, and for a hang its workers ended: nothing to wait on
            return []
        try:
            with self._lock:
                self._in_flight[line.id] = line
            future = self._pool.submit(self._off_the_caller, line, alarm)
        except RuntimeError:  # the fit has ended (the pool is shut down)
            self._outcome(line, "not carried out", "the fit ended before the action could start")
            return []
        self._under_way.append(future)
        return [] if line.diagnose else [future]  # stacks take long: their order comes a check later

    def wait_for_actions(self) -> None:
        """The fit ends, or its ranks ended their loop: let the actions under way (stacks being
        captured, an evict) reach the record, at most ACTION_WAIT_S more. Called without the
        fleet head's lock, which an action needs to write."""
        wait(self._under_way, timeout=ACTION_WAIT_S)

    def _choose_checkpoint(self, line: ActionLine) -> ActionLine:
        with self._lock:
            if line.alarm in DAMAGE_KINDS:
                self.book.damaged(line.attempt or 0)
                good = self.book.last_good()
                if good is None:
                    where = self.book.clean_through
                    self._planner.released(line.attempt)
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
                self._after_damage.add(line.id)  # its restart resumes from the book's choice (resume_from)
                return replace(line, checkpoint=_path(checkpoint), checkpoint_run_step=step, why=why)
            latest = self.book.latest()
        if latest is None:
            return replace(line, why="no checkpoint yet: the group restarts from the start")
        step, checkpoint = latest
        why = "Ray's latest checkpoint at the alarm (the restart resumes from Ray's latest when it starts)"
        return replace(line, checkpoint=_path(checkpoint), checkpoint_run_step=step, why=why)

    def _carry_out(self, line: ActionLine, alarm: FleetAlarm) -> None:
        action, attempt = line.action, line.attempt or 0
        if action not in RESTARTS + ("stop",):
            return
        evicted = self._evict(line) if action == "evict" else ""
        if evicted is None:  # the drain failed: the alarm only logs (said)
            return
        where = f"rank{'s' if len(line.ranks) != 1 else ''} {', '.join(map(str, line.ranks)) or '?'}"
        if line.node:
            where += f" on node {line.node}"
        when = f"run step {line.run_step}" if line.run_step is not None else "before the first step"
        said = f"the fleet's {line.alarm} alarm ({where}, {when}): {alarm.message}"
        if action == "stop":
            message = f"stopped by {said}"
            self._stop = message
        else:
            resume = f"checkpoint at run step {line.checkpoint_run_step}" if line.checkpoint else "the start"
            message = f"{evicted}restarting the worker group from {resume} after {said}"
        with self._lock:
            self._waiting.append(line)
            order = Order("stop" if action == "stop" else "reattempt", message, line.id)  # what a rank raises
            self._orders[attempt] = order
            self._ended_by.setdefault(attempt, (f"{line.alarm} {action}", alarm.time or time.time()))
            if action == "stop":
                self._stop_order = (attempt, order)
        if alarm.kind == "hang":  # the stuck ranks cannot read an order: their workers are ended
            self._end_stuck_ranks(line, attempt)

    def _evict(self, line: ActionLine) -> str | None:
        """Keep the line's ranks' nodes out of the run (or drain them, `evict_scope="cluster"`):
        what the restart's message says of it ("" when no node could be evicted and the group
        only restarts, said), or None when Ray refused every drain (the action then falls back
        to logging, said)."""
        with self._lock:
            known = self._ranks.get(line.attempt or 0, {})
            nodes = {known[r].node_id: known[r].node for r in line.ranks if r in known}
        done = self._eviction.evict(line, nodes)
        if done.fallback is not None:
            logger.warning("fleet action %d: evict falls back to reattempt: %s", line.id, done.fallback)
            self._write("actions", [ActionOutcome(line.id, action="reattempt", reason=done.fallback)])
            return ""
        if done.refused is not None:
            self._planner.released(line.attempt)
            self._write("actions", [ActionOutcome(line.id, outcome="failed", action="log", reason=done.refused)])
            return None
        scope = self._settings.evict_scope
        self._write(
            "actions",
            [
                ActionOutcome(
                    line.id,
                    evicted=tuple(done.evicted.values()),
                    evicted_ids=tuple(done.evicted),
                    scope=scope,
                    reason=done.notes,
                )
            ],
        )
        how = "kept out of this run" if scope == "run" else "drained for the whole cluster"
        named = ", ".join(f"{name} ({node_id[:8]})" for node_id, name in done.evicted.items())
        return f"evicted node{'s' if len(done.evicted) > 1 else ''} {named} ({how}); "

    def _end_stuck_ranks(self, line: ActionLine, attempt: int) -> None:
        with self._lock:
            known = self._ranks.get(attempt, {})
            targets = [known[r] for r in line.ranks if r in known] or list(known.values())
        if not targets:
            self._outcome(line, "failed", "the stuck ranks' workers are not known to the head")
            return
        for handle in targets:
            try:
                ray.kill(handle.actor, no_restart=True)
            except Exception as e:  # the order stays: a rank that reaches its check raises it
                self._outcome(line, "failed", f"could not end rank {handle.rank}'s worker: {type(e).__name__}: {e}")

    def _outcome(self, line: ActionLine, outcome: str, reason: str) -> None:
        logger.warning("fleet action %s after %s: %s (%s)", line.action, line.alarm, outcome, reason)
        self._write("actions", [ActionOutcome(line.id, outcome=outcome, reason=reason)])

    # ------------------------------------------------------------------ diagnose
    def _off_the_caller(self, line: ActionLine, alarm: FleetAlarm) -> None:
        """On the action thread: the stacks first, when asked, then the action, unless the fit
        has ended meanwhile."""
        try:
            if line.diagnose:
                self._diagnose(line)
            if not self._closed.is_set():
                self._carry_out(line, alarm)
        except Exception as e:  # never the fit's end
            if not self._closed.is_set():
                self._outcome(line, "failed", f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._in_flight.pop(line.id, None)

    def _diagnose(self, line: ActionLine) -> None:
        """py-spy's dumps of the named ranks, taken in parallel on their nodes, into the record."""
        with self._lock:
            known = self._ranks.get(line.attempt or 0, {})
            targets = [known[r] for r in line.ranks if r in known]
        stacks = stacks_of_ranks(targets) if targets else {}
        if self._closed.is_set():
            return
        self._write("stacks", [StackLine(line.id, h.rank, h.node, stacks[h.rank]) for h in targets])
        said = (
            f"stacks of ranks {', '.join(str(h.rank) for h in targets)}"
            if targets
            else "no stacks: the named ranks' workers are not known to the head"
        )
        if not targets:
            logger.warning("fleet action %d: %s", line.id, said)
        done = "done" if line.action == "log" else None  # a diagnose alone is done here
        self._write("actions", [ActionOutcome(line.id, diagnosed=said, outcome=done)])


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


def _final_outcome(line: ActionLine, stopped: bool) -> ActionOutcome:
    if line.action == "stop" and stopped:
        return ActionOutcome(line.id, outcome="done", reason="the fit ended with FleetStopError")
    return ActionOutcome(line.id, outcome="not carried out", reason="the fit ended before the ranks read the order")


def _path(checkpoint: Any) -> str | None:
    return getattr(checkpoint, "path", None) if checkpoint is not None else None
