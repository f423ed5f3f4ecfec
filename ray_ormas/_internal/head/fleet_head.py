"""Fleet health on the head node: where every rank's facts go, inside the run ledger actor.

    rank r      RankProbe.checked -> its node's relay (node/fleet_relay.py), its group's leader, then
                                     ledger.fleet_batch(rows): FleetHead.analyse_rows; or, before the
                                     relay has started, ledger.fleet_facts(facts): FleetHead.analyse
                                     (never awaited by the loop)
    ledger      FleetAnalyzer (fleet/analysis.py): scores and alarms once a check is complete, on numpy
                                     columns (on the ledger's event loop: quick)
                FleetHead.conclude-> the policy, then the fleet record (record/fleet_record.py), one log
                                     line per alarm, Ray's metrics (head/fleet_metrics.py), the fit's MLflow
                                     writer, the actions (in a thread of its own when a policy or an action
                                     could wait on something outside: the ledger keeps answering)
    controller  after_exception   -> FleetHead.worker_errors (an NCCLHangError becomes an alarm)
    a thread    every second      -> StallWatch.poll (fleet/stall.py): no new check in time, a `hang` alarm
    each complete check           -> the user's policy (head/policy_runner.py), if any: a `policy` alarm
                                     when it asks for something
    each attempt, before its      -> FleetHead.preflight: the ranks' probe results judged (fleet/preflight.py),
    first step                       the screen's lines in the record, its alarm emitted as a check's
    each check's alarms           -> FleetActions.on_alarms (head/fleet_actions.py): what `FleetSettings.actions`
                                     (or the policy) asks of them, the most severe carried out; the order a
                                     rank reads at its next check is the answer to its `fleet_facts` call
    driver      fit() ends        -> FleetHead.finish -> FleetSummary (result.ormas.fleet)

No process of its own (the hang watch is a thread of the ledger's), and no collective or barrier
on the workers: ranks send what they measured and go on. The head's time per check is measured
(analysis, record, metrics, MLflow hand-over) and reported in the summary.

Hooks relied on: the ledger's actor calls (head/ledger.py) and what the modules above rely on.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ray_ormas._internal.common.fleet_records import FleetAlarm, FleetLine, Order
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.fleet.analysis import CheckOutcome, FleetAnalyzer, hang_alarm, unreadable_alarm
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.preflight import ProbeResult, judge
from ray_ormas._internal.fleet.stall import StallWatch
from ray_ormas._internal.fleet.wire import Intro, rows_at
from ray_ormas._internal.head.checkpoint_pins import CheckpointPins
from ray_ormas._internal.head.fleet_actions import FleetActions
from ray_ormas._internal.head.node_eviction import GroupShape
from ray_ormas._internal.head.policy_runner import PolicyRunner
from ray_ormas._internal.head.rank_stacks import RankHandle
from ray_ormas._internal.record.check_summaries import RowSampler
from ray_ormas._internal.record.fleet_record import (
    FLEET_RECORD_VERSION,
    FleetRecordWriter,
    FleetSummary,
    fleet_summary,
    mlflow_entries,
    ranks_label,
    read_fleet_actions,
    read_fleet_alarms,
    read_fleet_attempts,
    read_fleet_preflight,
    read_fleet_summaries,
    read_fleet_table,
)
from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE
from ray_ormas._internal.record.store import RecordStore

logger = get_logger("ray_ormas.fleet")
HANG_ERROR = "NCCLHangError"
STALL_POLL_S = 1.0  # how often the hang watch looks (fleet/stall.py)


@dataclass(frozen=True)
class FleetSpec:
    """What the driver gives the head's fleet view."""

    settings: FleetSettings
    store: RecordStore
    fit_id: str
    run_name: str
    world: int  # the largest world size (an elastic fit's maximum)
    strategy: str
    elastic: tuple[int, int] | None = None  # (min, max) workers of an elastic fit
    driver_node: str | None = None  # the driver's node (hex id): never evicted
    worker_need: dict[str, float] | None = None  # the resources one worker asks for (ScalingConfig)
    min_workers: int | None = None  # the fewest workers a restarted group starts with


@dataclass(frozen=True)
class CompleteCheck:
    """A check every rank's facts are in for, as the analysis concluded it (`outcome`: None when
    the facts could not be used), and when (`time`, Unix seconds)."""

    outcome: CheckOutcome | None
    time: float

    def where(self) -> dict[str, Any]:
        """The check's place, as each of its lines in the fleet record starts."""
        o = self.outcome
        if o is None:
            return {}
        return {"attempt": o.attempt, "check": o.check, "step": o.step, "run_step": o.run_step, "time": self.time}

    def record_lines(self) -> list[dict[str, Any]]:
        """Its rows as the fleet record's `checks` lines: where, then each rank's row (made
        from the columns here: only for the checks the record keeps every row of)."""
        o = self.outcome
        if o is None:
            return []
        where = self.where()
        return [{**where, **row.to_line()} for row in o.ranks]


class FleetHead:
    """One fit's fleet view on the head node (see the module docstring)."""

    def __init__(self, spec: FleetSpec, tracking: Any = None) -> None:
        s = spec.settings
        self._spec = spec
        self._analyzer = FleetAnalyzer(s, spec.world, compare_digests=s.divergence and spec.strategy == "ddp")
        self._record = FleetRecordWriter(
            spec.store,
            spec.fit_id,
            {
                "format": "ray-ormas-fleet",
                "version": FLEET_RECORD_VERSION,
                "fit_id": spec.fit_id,
                "run_name": spec.run_name,
                "world_size": spec.world,
                "elastic": list(spec.elastic) if spec.elastic is not None else None,
                "strategy": spec.strategy,
                "settings": s.to_dict(),
            },
        )
        self._gauges = None
        if s.ray_metrics:
            try:
                from ray_ormas._internal.head.fleet_metrics import FleetGauges

                self._gauges = FleetGauges(spec.run_name, s.metrics_ranks)
            except Exception as e:  # Ray's metrics unavailable: the record and MLflow still get it all
                logger.warning("fleet metrics are off: %s: %s", type(e).__name__, e)
        self._tracking = tracking
        self._head_s = 0.0
        self._complete = 0
        self._messages: collections.Counter[str] = collections.Counter()  # what reached the head: FleetSummary.messages
        self._last_run_step = 0
        self._hangs_seen = False
        self._unreadable: set[int] = set()  # attempts with a rank whose facts cannot be read
        self._nodes: dict[tuple[int, int], str] = {}  # (attempt, rank) -> its node, from its facts
        self._last_world: int | None = None
        self._label = ranks_label({"world_size": spec.world, "elastic": spec.elastic and list(spec.elastic)})
        # The ledger calls come on its event loop, the hang watch's polls on a thread of its own.
        self._lock = threading.RLock()
        self._concluding = threading.Lock()  # one check's policy and emit at a time
        self._stall = StallWatch(s.hang_after_s, spec.world)
        self._actions = (
            FleetActions(
                s, self._write_action, spec.driver_node, GroupShape.of(spec), CheckpointPins(spec.store, spec.fit_id)
            )
            if s.acts
            else None
        )
        self._policy = PolicyRunner(s.policy) if s.policy is not None else None
        self._alarms_seen: list[FleetAlarm] = []  # what the policy sees of the fit's alarms
        self._sampler = RowSampler(s.record_ranks, s.record_rows_every)  # which checks keep every rank's row
        self._finished = threading.Event()
        threading.Thread(target=self._watch_for_hangs, name="ray-ormas-hang-watch", daemon=True).start()

    def offset(self, attempt: int, offset: int, world_size: int | None = None) -> None:
        """Rank 0's main monitor of attempt `attempt` starts at run step `offset`, with
        `world_size` ranks: one line in the fleet record's attempts, "resize" when an elastic
        fit restarted at another size (an event, never an alarm: the ranks are compared within
        one attempt)."""
        with self._lock:
            self._offset_locked(attempt, offset, world_size)

    def _offset_locked(self, attempt: int, offset: int, world_size: int | None) -> None:
        self._analyzer.set_offset(attempt, offset)
        self._stall.attempt_started(attempt, world_size)
        if self._actions is not None:
            self._actions.attempt_started(attempt, offset)
        if world_size is None:
            return
        previous, self._last_world = self._last_world, world_size
        line: dict[str, Any] = {
            "attempt": attempt,
            "world_size": world_size,
            "run_step": offset,
            "time": round(time.time(), 3),
        }
        if previous is None:
            line["event"] = "start"
        elif previous == world_size:
            line["event"] = "restart"
        else:
            line.update(event="resize", resized_from=previous)
            logger.info(
                "fleet: attempt %d runs on %d ranks (was %d, %s) from run step %d",
                attempt,
                world_size,
                previous,
                self._label,
                offset,
            )
        self._record.append("attempts", [line], urgent=True)

    @property
    def acts(self) -> bool:
        """Whether an alarm can act (`FleetSettings.actions`)."""
        return self._actions is not None

    def facts(self, attempt: int, facts: RankFacts) -> bool:
        """One rank's facts at one check (worker/fleet_probe.py); True when they completed the
        check (its alarms, and the actions they asked for, are decided): `analyse`, then
        `conclude` in this thread."""
        check = self.analyse(attempt, facts)
        if check is None:
            return False
        self.conclude(check)
        return True

    @property
    def concludes_slowly(self) -> bool:
        """Whether concluding a check can wait on something outside (the user's policy, a
        bounded call): then the ledger concludes off its event loop."""
        return self._policy is not None or self._actions is not None

    def count(self, what: str, n: int = 1) -> None:
        """What reached the head (the ledger counts): `FleetSummary.messages`."""
        self._messages[what] += n

    def groups_on_request(self) -> None:
        """The facts come through the nodes' relays, without parameter-group digests: a check
        whose replicas diverge is held until the relays send the digests that locate it
        (`wanted_groups`, `groups`), or until `release` gives up on them."""
        self._analyzer.groups_on_request = True

    def wanted_groups(self, attempt: int, check: int) -> tuple[int, ...]:
        """The ranks whose parameter-group digests at `check` of `attempt` the head waits for."""
        with self._lock:
            return next((r for a, c, r in self._analyzer.wanted_groups() if (a, c) == (attempt, check)), ())

    def held(self, attempt: int, check: int) -> bool:
        """Whether `check` of `attempt` is complete but held (its divergence, or one before it,
        waits for group digests)."""
        with self._lock:
            return (attempt, check) in self._analyzer.held()

    def groups(self, attempt: int, check: int, groups: dict[int, tuple[str, ...]]) -> list[CompleteCheck]:
        """Parameter-group digests a relay sent for a held check: the checks complete now, in order."""
        with self._lock:
            return [self._completed(o) for o in self._analyzer.add_groups(attempt, check, groups)]

    def release(self, attempt: int, check: int | None = None) -> list[CompleteCheck]:
        """The held checks of `attempt` up to `check` (all when None) complete without the group
        digests that did not come: the divergence is alarmed, not located."""
        with self._lock:
            return [self._completed(o) for o in self._analyzer.release(attempt, check)]

    def analyse(self, attempt: int, facts: RankFacts) -> CompleteCheck | None:
        """One rank's facts at one check: the check, once every rank's facts are in (else None;
        also while it is held, see `groups_on_request`). Pure analysis, quick: the ledger calls
        it on its event loop."""
        started = time.thread_time()  # CPU time: what the head spends, not how busy the node is
        try:
            with self._lock:
                self._stall.reached(attempt, facts.rank, facts.check, time.monotonic(), facts.step)
                if facts.node is not None:  # a hang alarm names the stuck ranks' nodes
                    self._nodes[(attempt, facts.rank)] = facts.node
                outcome = self._analyzer.add(attempt, facts)
                return None if outcome is None else self._completed(outcome)
        except Exception as e:  # a malformed fact must not take the ledger down
            logger.warning("fleet: could not use rank facts (%s: %s)", type(e).__name__, e)
            return CompleteCheck(None, time.time())
        finally:
            self._head_s += time.thread_time() - started

    def analyse_rows(
        self, attempt: int, packed: bytes, extras: Mapping[int, Mapping[str, Any]], intros: Mapping[int, Intro]
    ) -> CompleteCheck | None:
        """A node's packed rows at one check (its relay's `fleet_batch`): as `analyse`, for them all."""
        started = time.thread_time()
        try:
            with self._lock:
                check, step, ranks = rows_at(packed)
                self._stall.reached_all(attempt, ranks, check, time.monotonic(), step)
                for rank, intro in intros.items():  # a hang alarm names the stuck ranks' nodes
                    if intro.node is not None:
                        self._nodes[(attempt, rank)] = intro.node
                outcome = self._analyzer.add_rows(attempt, packed, extras, intros, (check, ranks))
                return None if outcome is None else self._completed(outcome)
        except Exception as e:  # malformed rows must not take the ledger down
            logger.warning("fleet: could not use a relay's rows (%s: %s)", type(e).__name__, e)
            return CompleteCheck(None, time.time())
        finally:
            self._head_s += time.thread_time() - started

    def _completed(self, outcome: CheckOutcome) -> CompleteCheck:
        """A check's outcome, stamped and counted (under the lock)."""
        now = round(time.time(), 3)
        outcome.alarms = [replace(a, time=now) for a in outcome.alarms]
        self._last_run_step = outcome.run_step
        self._complete += 1
        if self._actions is not None:
            self._actions.checked(
                outcome.attempt, outcome.run_step, outcome.columns.clean(self._analyzer.compare_digests)
            )
        return CompleteCheck(outcome, now)

    def conclude(self, check: CompleteCheck) -> None:
        """A complete check: the user's policy (within its time limit, head/policy_runner.py),
        then its lines, alarms and actions. One check at a time, in the order they completed."""
        outcome = check.outcome
        if outcome is None:
            return
        with self._concluding:
            started = time.thread_time()
            try:
                alarms = list(outcome.alarms)
                if self._policy is not None:
                    alarms += self._policy.consult(outcome, (*self._alarms_seen, *alarms), check.time)
                self._emit(check, alarms, settle=True)
            except Exception as e:  # a malformed fact must not take the ledger down
                logger.warning("fleet: could not conclude a check (%s: %s)", type(e).__name__, e)
            finally:
                self._head_s += time.thread_time() - started

    def order_for(self, attempt: int) -> Order | None:
        """The order the ranks of `attempt` carry out at their next check, if an action gave one."""
        return self._actions.order_for(attempt) if self._actions is not None else None

    def restart_cause(self, attempt: int) -> tuple[str, float] | None:
        """The alarm and action that ended `attempt`, and the alarm's time (None: none did)."""
        return self._actions.restart_cause(attempt) if self._actions is not None else None

    def order_at_end(self, attempt: int) -> Order | None:
        """The ranks of `attempt` ended their loop: its order, once the actions under way (a
        diagnose, an evict) have decided theirs. Called without the lock, which they need to write."""
        if self._actions is None:
            return None
        self._actions.wait_for_actions()
        return self._actions.order_for(attempt)

    def incomplete(self, attempt: int) -> bool:
        """Whether `attempt` has a rank whose facts cannot be read (its checks never complete)."""
        return attempt in self._unreadable

    # ------------------------------------------------------------------ actions (head/fleet_actions.py)
    def rank_joined(self, attempt: int, rank: int, actor: Any, node_id: str, node: str, pid: int) -> None:
        """A rank of `attempt` says where it runs (only when an alarm can act)."""
        if self._actions is not None:
            self._actions.rank_joined(attempt, RankHandle(rank, actor, node_id, node, pid))

    def checkpoint_announced(self, attempt: int, step: int) -> None:
        """The ranks of `attempt` met to report a checkpoint after `step` steps of its segment."""
        if self._actions is not None:
            with self._lock:
                self._actions.book.announced(attempt, self._analyzer.run_step(attempt, step))

    def checkpoint_taken(self, run_step: int, attempt: int, checkpoint: Any) -> None:
        if self._actions is not None:
            with self._lock:
                self._actions.taken(run_step, attempt, checkpoint)

    def resume_from(self) -> Any:
        """The checkpoint a restart resumes from when it is not Ray's latest (else None)."""
        return self._actions.resume_from() if self._actions is not None else None

    def stop_message(self) -> str | None:
        return self._actions.stop_message() if self._actions is not None else None

    def excluded_nodes(self) -> list[str]:
        """The nodes a run-scoped evict keeps this run's later worker groups off."""
        return self._actions.excluded_nodes() if self._actions is not None else []

    def _write_action(self, name: str, records: Sequence[FleetLine]) -> None:
        """Action and stack lines: to the record, one console line each, MLflow and Ray's counter."""
        lines = [r.to_line() for r in records]
        if not lines:
            return
        with self._lock:
            self._record.append(name, lines, urgent=True)
            if name != "actions":
                return
            for line in lines:
                _say_action(line)
            if self._gauges is not None:
                self._gauges.acted(lines)
            if self._tracking is not None:
                self._tracking.fleet(mlflow_entries([], [], 0, lines))

    # ------------------------------------------------------------------ the pre-flight screen
    @property
    def preflight_timeout_s(self) -> float:
        """The longest the ranks of an attempt wait for each other's probe results."""
        return self._spec.settings.preflight.timeout_s

    def preflight(self, attempt: int, results: list[ProbeResult], missing: list[int]) -> Order | None:
        """An attempt's probe results, every rank's (or all that came: `missing` never did): the
        verdict to the record (its ranks' lines, then the verdict's), the console, Ray's gauges and
        MLflow; its alarm emitted as any other, so that its action is carried out (an evict waited
        for). Returns the order the ranks raise before their first step, if the action gave one.
        Called off the ledger's event loop: an evict calls out."""
        verdict = judge(attempt, results, self._spec.settings.preflight, missing)
        summary = verdict.summary()
        with self._lock:
            self._record.append("preflight", [*verdict.rows, {"event": "verdict", **summary}], urgent=True)
            if self._gauges is not None:
                self._gauges.screened(verdict.rows)
            if self._tracking is not None:
                self._tracking.fleet(mlflow_entries([], [], 0, preflight=[summary]))
        seconds = f" in {verdict.seconds:.2f} s" if verdict.seconds is not None else ""
        if verdict.alarm is None:
            logger.info(
                "fleet pre-flight: attempt %d, %d ranks screened%s, clean%s",
                attempt,
                len(verdict.rows),
                seconds,
                f" ({verdict.note})" if verdict.note else "",
            )
            return None
        self._emit(None, [replace(verdict.alarm, time=round(time.time(), 3))], settle=True)
        order = self.order_for(attempt)
        if order is not None and self._actions is not None:  # the group restarted, and ends here
            self._actions.attempt_screened_out(attempt)
        return order

    def unreadable(self, attempt: int, rank: int, check: int, error: str) -> None:
        """A rank's facts could not be read: an alarm that names it (in the fleet record, one
        warning, the fit's fleet summary), since the checks it misses cannot be analyzed."""
        self._unreadable.add(attempt)
        self._emit(None, [replace(unreadable_alarm(attempt, rank, check, error), run_step=self._last_run_step)])

    def worker_errors(self, attempt: int, per_rank: dict[int, str]) -> None:
        """A failed attempt's errors: an NCCLHangError (Ray's hang detector) becomes an alarm."""
        with self._lock:
            self._stall.attempt_ended()
        hung = sorted(r for r, text in per_rank.items() if text.startswith(HANG_ERROR))
        if hung:
            self.hang(attempt, per_rank[hung[0]], hung)

    def hang(self, attempt: int, error: str, ranks: list[int]) -> None:
        if self._hangs_seen and not ranks:
            return  # the same hang, seen again as the fit's own error
        self._hangs_seen = True
        self._emit(None, [replace(hang_alarm(attempt, error, ranks), run_step=self._last_run_step)])

    def meeting(self, kind: str) -> None:
        """A rank arrived at a report's meeting ("final": its loop has ended)."""
        with self._lock:
            if kind == "final":
                self._stall.winding_down()
            else:
                self._stall.reporting()

    def _watch_for_hangs(self) -> None:
        while not self._finished.wait(STALL_POLL_S):
            try:
                with self._lock:
                    alarm = self._stall.poll(time.monotonic())
                    if alarm is None:
                        continue
                    attempt = alarm.attempt or 0
                    step = alarm.step
                    at = self._last_run_step if step is None else self._analyzer.run_step(attempt, step)
                    nodes = sorted({self._nodes[(attempt, r)] for r in alarm.ranks if (attempt, r) in self._nodes})
                    self._emit(None, [replace(alarm, run_step=at, node=alarm.node or ",".join(nodes) or None)])
            except Exception as e:  # the watch must never take the ledger down
                logger.warning("fleet: the hang watch stopped (%s: %s)", type(e).__name__, e)
                return

    def _emit(self, check: CompleteCheck | None, alarms: list[FleetAlarm], settle: bool = False) -> None:
        """A check's summary, rows and alarms, or alarms alone (`check` None): to the record, the
        console, Ray's metrics, MLflow, and the actions; `settle`: the caller may wait for an
        evict's order (a check's conclusion, in a thread of its own), never under the lock. Each
        rank's row is made only when the record keeps it, or Ray's metrics show it."""
        evicting = []
        alarm_lines = [a.to_line() for a in alarms]
        outcome = check.outcome if check is not None else None
        with self._lock:
            summary: dict[str, Any] | None = None
            lines: Callable[[], list[dict[str, Any]]] = list
            if check is not None and outcome is not None:
                summary = outcome.columns.summary(check.where())
                lines = functools.lru_cache(maxsize=1)(check.record_lines)  # made once, if at all
                summaries, rows = self._sampler.take(outcome.check, len(outcome.columns), lines, summary, bool(alarms))
            else:
                summaries, rows = self._sampler.take(None, 0, lines, {}, bool(alarms))
            self._record.append("summaries", summaries)
            self._record.append("checks", rows)
            self._record.append("alarms", alarm_lines, urgent=True)
            self._alarms_seen += alarms
            for a in alarms:
                logger.warning("fleet %s: %s", a.kind, a.message)
            if self._actions is not None and alarms:
                evicting = self._actions.on_alarms(alarms)  # one decision for the check: the most severe
            if self._gauges is not None:
                per_rank = lines() if summary is not None and summary["ranks"] <= self._gauges.per_rank_up_to else []
                self._gauges.update(per_rank, outcome.loss_mean if outcome else None, alarm_lines, summary)
            if self._tracking is not None:
                entries = mlflow_entries(rows, alarm_lines, self._spec.settings.mlflow_ranks, summaries=summaries)
                self._tracking.fleet(entries)
        if settle and self._actions is not None:
            self._actions.settle(evicting)

    def finish(self, stopped: bool = False) -> FleetSummary:
        """The fit ended (`stopped`: with a `stop` action's `FleetStopError`): close the record,
        read it back, summarize."""
        self._finished.set()
        for attempt in sorted({a for a, _ in self._analyzer.held()}):  # group digests that never came
            for check in self.release(attempt):
                self.conclude(check)
        if self._actions is not None:
            self._actions.wait_for_actions()
        with self._lock:  # the hang watch's last poll has emitted what it had
            self._stall.winding_down()
            if self._actions is not None:
                self._actions.finished(stopped)
            held = self._sampler.flush()  # the last checks' summaries, held back in case an alarm came
            self._record.append("summaries", held)
            if self._tracking is not None and held:
                self._tracking.fleet(mlflow_entries([], [], self._spec.settings.mlflow_ranks, summaries=held))
            self._record.close()
        store = self._spec.store
        checks = read_fleet_table(store, self._spec.fit_id, CHECKS_TABLE)
        alarms = read_fleet_alarms(store, self._spec.fit_id)
        attempts = read_fleet_attempts(store, self._spec.fit_id)
        actions = read_fleet_actions(store, self._spec.fit_id)
        summaries = read_fleet_summaries(store, self._spec.fit_id)
        preflight = read_fleet_preflight(store, self._spec.fit_id)
        per_check = self._head_s / self._complete * 1000 if self._complete else None
        return fleet_summary(
            store.shown(self._record.path),
            checks,
            alarms,
            per_check,
            attempts,
            actions,
            summaries=summaries,
            messages=dict(self._messages),
            preflight=preflight,
        )


def _say_action(line: dict[str, Any]) -> None:
    """One console line per action and per outcome."""
    if line.get("event") == "outcome":
        extra = f" in {line['seconds']} s" if line.get("seconds") is not None else ""
        reason = f": {line['reason']}" if line.get("reason") else ""
        said = line.get("outcome") or line.get("diagnosed")
        if said is None and line.get("evicted"):
            how = "drained for the whole cluster: " if line.get("scope") == "cluster" else "kept out of this run: "
            said = how + ", ".join(f"{n} ({i[:8]})" for n, i in zip(line["evicted"], line["evicted_ids"]))
        if said is None and line.get("action"):
            said = f"{line['action']} instead"
        logger.warning("fleet action %d: %s%s%s", line["id"], said, extra, reason)
        return
    ranks = ", ".join(map(str, line.get("ranks") or [])) or "-"
    what = ("diagnose, then " if line.get("diagnose") else "") + str(line["action"])
    chosen = f", from checkpoint {line['checkpoint']} ({line['why']})" if line.get("checkpoint") else ""
    outcome = f": {line['outcome']}" if line.get("outcome") not in (None, "requested") else ""  # bounded, ...
    reason = f" ({line['reason']})" if line.get("reason") else ""
    logger.warning(
        "fleet action %d: %s after the %s alarm on ranks %s %s%s%s%s",
        line["id"],
        what,
        line["alarm"],
        ranks,
        f"at run step {line['run_step']}" if line.get("run_step") is not None else "before the first step",
        chosen,
        outcome,
        reason,
    )
