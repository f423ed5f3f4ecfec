"""The run ledger: one small Ray actor per `fit()` that the driver, the controller and the workers share.

It does three things:

* **Rendezvous before every ray-ormas report.** `ray.train.report` is a barrier: if ranks call
  it different numbers of times (loaders of different lengths, a rank that left its loop early),
  Ray waits forever. Before ray-ormas calls `ray.train.report`, every rank first meets at the
  ledger and says which report it is at (`user`, `periodic` or `final`) and at which step. If the
  ranks disagree, each raises `RankMismatchError` at once; if a rank does not arrive within
  `sync_timeout_s`, the waiting ranks raise `RankSyncTimeoutError` naming the missing ranks. A
  clear error instead of a hang. Meetings are keyed by a token that rank 0 draws at the start of
  each worker-group attempt, so a restarted group never meets the previous one's ranks.
* **A grace period for rank 0's record.** When a rank's loop raises, Ray tears the whole worker
  group down as soon as it sees the error. A failing rank other than 0 therefore first gives
  rank 0 a moment (`wait_for_rank0`): if rank 0 is closing its record too, its `run_end` and
  upload are not cut off. If rank 0 is busy elsewhere (training, or waiting in a collective),
  the failing rank waits only a couple of seconds.
* **The fleet view.** `LedgerCallback` (head/ledger_callback.py) is a Ray Train `UserCallback`; it runs
  on the controller,
  and its `after_report` hook receives one metrics dict per rank (index = world rank) for every
  report. It forwards those that carry ray-ormas facts to the ledger, so what the driver returns
  is exactly what went through `ray.train.report`.

* **The fleet view's home.** With fleet health on, every rank sends its facts at every check
  (`fleet_facts`, never awaited) and the ledger's `FleetHead` (head/fleet_head.py) scores them, writes
  the fleet record, Ray's metrics and the MLflow entries; `finish_fleet` summarizes it.

* **The pre-flight screen's meeting.** Before the first step of each attempt, every rank hands
  its probe results to `preflight` (worker/preflight.py) and waits: once all of the attempt's
  ranks are in (or `PreflightSettings.timeout_s` has passed), the fleet head judges them
  (head/fleet_head.py `preflight`), and each rank gets the order its alarm's action gave, if any.

* **The MLflow writer's door.** When the fit is tracked, the ledger opens the fit's
  `TrackingWriter` (head/mlflow_writer.py) in the job's MLflow host (head/mlflow_host.py,
  through head/mlflow_link.py; in its own process where there is no host) and passes it rank
  0's rows (`track_rows`), the controller's reports (`track_report`) and the end of attempts and
  of the fit; so the head node is the only one that talks to MLflow, and a fit whose job's host
  is up imports none of MLflow.

The ledger is created by the driver on the head node (as Ray Train pins its own state actor,
so that losing a worker node never takes the ledger along), lives as long as the driver's
handle, and is killed by the trainer when `fit()` ends. Rank 0 also checks in at the ledger at
the start of each worker-group attempt (`begin_attempt`), which numbers the attempts and keeps
each one's world size: an elastic fit (`ScalingConfig(num_workers=(min, max))`) restarts the
group at another size, and each rendezvous waits for the ranks of its own attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from ray_ormas._internal.common.fleet_records import Order
from ray_ormas._internal.common.meetings import Arrival
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.preflight import ProbeResult
from ray_ormas._internal.fleet.wire import Intro, rows_at
from ray_ormas._internal.head.goodput_keeper import GoodputKeeper, GoodputSpec
from ray_ormas._internal.node.fleet_relay import GROUP_NODES, start_relay
from ray_ormas._internal.record.fit_timeline import ClockReading
from ray_ormas._internal.record.goodput import GoodputAccount

KEEP_COMPLETED = 64  # the complete checks a late waiter can still find
ORDER_WAIT_S = 5.0  # the longest a rank's facts wait for the other ranks' before the answer goes back

if TYPE_CHECKING:  # built inside the actor, on the head node, only when asked for
    from ray_ormas._internal.head.fleet_head import CompleteCheck, FleetHead, FleetSpec
    from ray_ormas._internal.head.mlflow_link import HostedWriter
    from ray_ormas._internal.head.mlflow_writer import TrackingOutcome, TrackingWriter, WriterSpec
    from ray_ormas._internal.record.fleet_record import FleetSummary
    from ray_ormas._internal.record.staging import Staging


@dataclass
class _Meeting:
    arrivals: dict[int, Arrival] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Screen:
    """One attempt's pre-flight screen: the results in, and the verdict's order once judged."""

    results: dict[int, ProbeResult] = field(default_factory=dict)
    judging: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    order: Order | None = None


@dataclass(frozen=True)
class LedgerSnapshot:
    """What the driver reads back from the ledger (`RunLedger.snapshot`), at the fit's end or
    on its way out."""

    reports: list[list[dict[str, Any]]]  # per `ray.train.report`, each rank's metrics (index = world rank)
    exceptions: list[dict[int, str]]  # per failed attempt, each failing rank's error
    records: dict[str, str]  # monitor name -> its record folder
    staged: list[Staging]  # segments still staged on a node (object storage), to sweep

    @property
    def final(self) -> dict[str, Any]:
        """Rank 0's metrics of the last report ({} before the first)."""
        return dict(self.reports[-1][0]) if self.reports and self.reports[-1] else {}


class Ledger:
    """Rendezvous and fleet log of one `fit()`. All methods are cheap; none touches tensors.
    Runs as the `RunLedger` actor (below); the class itself is what a test builds in-process."""

    def __init__(
        self, tracking: WriterSpec | None = None, fleet: FleetSpec | None = None, goodput: GoodputSpec | None = None
    ) -> None:
        self._tracking: TrackingWriter | HostedWriter | None = None
        if tracking is not None:  # the fit is tracked in MLflow (in the job's MLflow host)
            from ray_ormas._internal.head.mlflow_link import open_writer

            self._tracking = open_writer(tracking)
        self._fleet: FleetHead | None = None
        if fleet is not None:  # fleet health is on (head/fleet_head.py)
            from ray_ormas._internal.head.fleet_head import FleetHead

            self._fleet = FleetHead(fleet, self._tracking)
        self._goodput = GoodputKeeper(goodput, self._tracking) if goodput is not None else None
        self._last_checked: dict[int, int] = {}  # attempt -> the step of its last complete fleet check
        self._meetings: dict[tuple[str, int], _Meeting] = {}
        self._reports: list[list[dict[str, Any]]] = []
        self._exceptions: list[dict[int, str]] = []
        self._records: dict[str, str] = {}
        self._staged: list[Staging] = []  # every segment staged on a node (object storage)
        self._rank0_closing: dict[str, asyncio.Event] = {}
        self._rank0_closed: dict[str, asyncio.Event] = {}
        self._attempts: list[str] = []
        self._worlds: dict[int, int] = {}  # attempt -> its world size (an elastic fit's may change)
        self._resume_answers: dict[str, Any] = {}  # attempt token -> the checkpoint its ranks resume from
        self._changes: dict[tuple[int, int], asyncio.Event] = {}  # (attempt, check): complete, or held for digests
        self._relays: dict[str, dict[str, Any]] = {}  # attempt token -> node id -> its fleet relay
        self._completed: dict[tuple[int, int], None] = {}  # the last KEEP_COMPLETED complete checks, in order
        self._screens: dict[int, _Screen] = {}  # attempt -> its pre-flight screen

    def alive(self) -> bool:
        """For the MLflow host (head/mlflow_host.py), which drops the writer of a ledger that died."""
        return True

    def begin_attempt(self, token: str, world_size: int | None = None) -> int:
        """Rank 0 of a worker-group attempt checks in (with its world size); returns the
        attempt's index (0, 1, ...). Other calls use it to number the attempt of a token."""
        if token not in self._attempts:
            self._attempts.append(token)
            self._end_relays(keep=token)  # the earlier attempts' groups have ended
        attempt = self._attempts.index(token)
        if world_size is not None:
            self._worlds[attempt] = world_size
            if self._goodput is not None:
                self._goodput.attempt(attempt, world_size)
        return attempt

    # -------------------------------------------------------------- goodput (head/goodput_keeper.py)
    def goodput_clock(self, token: str, step_offset: int, reading: ClockReading) -> None:
        """Rank 0's step clock at a check, or at the loop's end (worker/step_clock.py)."""
        if self._goodput is not None:
            self._goodput.reading(self.begin_attempt(token), reading, step_offset)

    def goodput_failure(self, token: str, steps: int) -> None:
        """A rank's loop raised, `steps` into the attempt (its peer's failure, or its own)."""
        if self._goodput is not None:
            self._goodput.rank_failed(self.begin_attempt(token), steps)

    def finish_goodput(self, ended: float, status: str) -> GoodputAccount | None:
        """The fit ended (the driver's wind-down): its account, and the timeline written."""
        return self._goodput.close(ended, status) if self._goodput is not None else None

    # -------------------------------------------------------------- fleet health (head/fleet_head.py)
    def fleet_offset(self, token: str, offset: int) -> None:
        """Rank 0: the run step at which this attempt's main monitor starts."""
        if self._fleet is not None:
            attempt = self.begin_attempt(token)
            self._fleet.offset(attempt, offset, self._worlds.get(attempt))

    async def fleet_facts(self, token: str, facts: RankFacts) -> Order | None:
        """One rank's facts at one check. When an alarm can act, the answer comes once the check
        is complete (at most ORDER_WAIT_S later): the order an alarm's action gave this attempt's
        ranks (head/fleet_actions.py), or None. Every rank reads it at its next check, so all of
        them carry it out at the same one."""
        if self._fleet is None:
            return None
        attempt = self.begin_attempt(token)
        self._fleet.count("rank_calls")
        await self._fleet_concluded(attempt, facts.check, self._fleet.analyse(attempt, facts))
        if not self._fleet.acts:
            return None
        await self._fleet_wait(attempt, facts.check, set())
        return self._fleet.order_for(attempt)

    async def fleet_batch(
        self, token: str, rows: bytes, extras: dict[int, dict[str, Any]], intros: dict[int, Intro]
    ) -> tuple[Order | None, tuple[int, ...]]:
        """The facts of a node's ranks at one check, packed by the node's relay (fleet/wire.py:
        the rows one after another; `extras` by rank; `intros`: the ranks seen for the first time
        this attempt). Answers once the check is complete (at most ORDER_WAIT_S later) with the
        attempt's order (as `fleet_facts`) and (); or, as soon as the head holds the check for a
        divergence, with None and the ranks of this batch whose parameter-group digests locate
        it: the relay sends them (`fleet_groups`), whose answer is the order."""
        if self._fleet is None:
            return None, ()
        attempt = self.begin_attempt(token)
        self._fleet.groups_on_request()
        check, _, ranks = rows_at(rows)
        self._fleet.count("relay_messages")
        self._fleet.count("relay_rows", len(ranks))
        if not ranks:
            return self._fleet.order_for(attempt), ()
        await self._fleet_concluded(attempt, check, self._fleet.analyse_rows(attempt, rows, extras, intros))
        wanted = await self._fleet_wait(attempt, check, set(ranks))
        return (None, wanted) if wanted else (self._fleet.order_for(attempt), ())

    async def fleet_groups(self, token: str, check: int, groups: dict[int, tuple[str, ...]]) -> Order | None:
        """The parameter-group digests of a relay's ranks at `check`, which `fleet_batch` asked
        for; answers as `fleet_facts` does, once the check is complete."""
        if self._fleet is None:
            return None
        attempt = self.begin_attempt(token)
        self._fleet.count("relay_messages")
        await self._conclude(attempt, self._fleet.groups(attempt, check, groups))
        await self._fleet_wait(attempt, check, set())
        return self._fleet.order_for(attempt)

    async def preflight(self, token: str, result: ProbeResult, world_size: int, where: tuple[Any, int]) -> Order | None:
        """One rank's pre-flight results (`where`: its worker actor, None when no alarm can act,
        and its pid, for an action on it).
        Answers once every rank of the attempt is in, or `timeout_s` after the first came: the
        order the screen's alarm gave the attempt (head/fleet_actions.py), or None."""
        if self._fleet is None:
            return None
        attempt = self.begin_attempt(token)
        screen = self._screens.setdefault(attempt, _Screen())
        screen.results[result.rank] = result
        if result.node_id is not None:
            actor, pid = where
            self._fleet.rank_joined(attempt, result.rank, actor, result.node_id, result.node or "?", pid)
        if len(screen.results) < world_size:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(screen.done.wait(), self._fleet.preflight_timeout_s)
        if not screen.judging:  # the last rank in, or the first waiter past the timeout
            screen.judging = True
            missing = sorted(set(range(world_size)) - set(screen.results))
            screen.order = await asyncio.to_thread(
                self._fleet.preflight, attempt, list(screen.results.values()), missing
            )
            screen.done.set()
        await screen.done.wait()
        return screen.order

    def fleet_relay(self, token: str, node_id: str) -> Any:
        """The fleet relay of node `node_id` for attempt `token` (node/fleet_relay.py), started at
        the first rank's asking. It serves its attempt only: the ledger ends it when the attempt's
        worker group fails or the next attempt begins (`_end_relays`), so a node the fleet evicts
        or Ray drains keeps nothing of the run. Every GROUP_NODES-th relay started leads the ones
        started after it up to the next: they send it their rows, it sends them to the ledger."""
        self.begin_attempt(token)
        relays = self._relays.setdefault(token, {})
        if node_id not in relays:
            started = list(relays.values())
            leader = started[len(started) - len(started) % GROUP_NODES] if len(started) % GROUP_NODES else None
            relays[node_id] = start_relay(ray.get_runtime_context().current_actor, node_id, leader)
        return relays[node_id]

    def _end_relays(self, keep: str | None = None) -> None:
        """Ends the fleet relays of every attempt but `keep` (their ranks are gone)."""
        for token in [t for t in self._relays if t != keep]:
            for relay in self._relays.pop(token).values():
                with contextlib.suppress(Exception):  # already gone with its node
                    ray.kill(relay, no_restart=True)

    async def _fleet_concluded(self, attempt: int, number: int, complete: CompleteCheck | None) -> None:
        """Check `number`, just analysed: concluded when it is complete (`complete`), its
        waiters told when it is held (they may be asked for group digests)."""
        assert self._fleet is not None
        if complete is not None:
            await self._conclude(attempt, [complete], number)
        elif self._fleet.held(attempt, number):
            self._changed(attempt, number)

    async def _conclude(self, attempt: int, checks: list[CompleteCheck], check: int | None = None) -> None:
        """Complete checks concluded in order (off the event loop when that can be slow: a
        policy, an action), and their waiters woken (`check`: the one a malformed fact ended)."""
        assert self._fleet is not None
        for complete in checks:
            if self._fleet.concludes_slowly:
                await asyncio.to_thread(self._fleet.conclude, complete)
            else:
                self._fleet.conclude(complete)
            outcome = complete.outcome
            if outcome is not None and self._goodput is not None:
                since = outcome.step - self._last_checked.get(attempt, -1)
                self._last_checked[attempt] = outcome.step
                self._goodput.held_data(attempt, since, *_data_median_and_max(outcome.columns.data_s))
            number = complete.outcome.check if complete.outcome is not None else check
            if number is not None:
                self._completed[(attempt, number)] = None
                while len(self._completed) > KEEP_COMPLETED:
                    del self._completed[next(iter(self._completed))]
                self._changed(attempt, number)

    def _changed(self, attempt: int, check: int) -> None:
        """Wakes whoever waits on `check` of `attempt` (`_fleet_wait`)."""
        event = self._changes.pop((attempt, check), None)
        if event is not None:
            event.set()

    async def _fleet_wait(self, attempt: int, check: int, ranks: set[int]) -> tuple[int, ...]:
        """Returns () once `check` of `attempt` is complete, or the ranks of `ranks` whose group
        digests the head holds it for, at most ORDER_WAIT_S later. Past that, a held check is
        released: concluded with its divergence not located."""
        assert self._fleet is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ORDER_WAIT_S
        while (attempt, check) not in self._completed and not self._fleet.incomplete(attempt):
            wanted = tuple(r for r in self._fleet.wanted_groups(attempt, check) if r in ranks)
            if wanted:
                return wanted
            left = deadline - loop.time()
            if left <= 0:
                if self._fleet.held(attempt, check):
                    await self._conclude(attempt, self._fleet.release(attempt, check))
                break
            event = self._changes.setdefault((attempt, check), asyncio.Event())
            while len(self._changes) > KEEP_COMPLETED:  # checks that never completed (a rank gone)
                del self._changes[next(iter(self._changes))]  # their waiters still time out
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), left)
        return ()

    async def fleet_order_at_end(self, token: str) -> Order | None:
        """Every rank of the attempt has ended its loop (they met for the final report): the
        order an alarm's action gave the attempt after the ranks' last check, once the stacks a
        `diagnose` is capturing are in and its action decided (at most STACK_TIMEOUT_S more), or
        None. The ranks raise it there, so that an action asked near the end is still carried out."""
        if self._fleet is None or not self._fleet.acts:
            return None
        return await asyncio.to_thread(self._fleet.order_at_end, self.begin_attempt(token))

    def fleet_rank(self, token: str, rank: int, actor: Any, node_id: str, node: str, pid: int) -> None:
        """A rank says where it runs, when an alarm can act (a hang's action ends its worker,
        `diagnose` reads its stacks on its node)."""
        if self._fleet is not None:
            self._fleet.rank_joined(self.begin_attempt(token), rank, actor, node_id, node, pid)

    def excluded_nodes(self) -> list[str]:
        """The nodes (hex ids) this run's fleet evicted from its later worker groups (asked by the
        controller before each group starts, head/placement_callback.py)."""
        return self._fleet.excluded_nodes() if self._fleet is not None else []

    def checkpoint_taken(self, run_step: int | None, checkpoint: Any) -> None:
        """The controller registered a checkpoint reported at rank 0's `run_step`."""
        if self._fleet is not None and isinstance(run_step, int):
            self._fleet.checkpoint_taken(run_step, max(len(self._attempts) - 1, 0), checkpoint)

    def resume_from(self, token: str | None = None) -> Any:
        """The checkpoint a restarted group resumes from when an action chose one that is not
        Ray's latest (worker/resume.py); None: Ray's latest. Decided at the first question of the
        attempt `token` and given to each of its ranks alike: an answer that changed between two
        ranks' questions (rank 0 already training, Ray's latest moved on) would start them at
        different steps."""
        if self._fleet is None:
            return None
        if token is None:
            return self._fleet.resume_from()
        if token not in self._resume_answers:
            self._resume_answers[token] = self._fleet.resume_from()
        return self._resume_answers[token]

    def fleet_unreadable(self, token: str, rank: int, check: int, error: str) -> None:
        """A rank could not read its facts at a check (it says so once per attempt)."""
        if self._fleet is not None:
            self._fleet.unreadable(self.begin_attempt(token), rank, check, error)

    def fleet_error(self, error: str) -> None:
        """The fit itself failed with Ray's NCCLHangError (raised by the controller, not a worker)."""
        if self._fleet is not None:
            self._fleet.hang(max(len(self._attempts) - 1, 0), error, [])

    async def finish_fleet(self, stopped: bool = False) -> FleetSummary | None:
        """The fit ended (`stopped`: the driver saw a `stop` action's `FleetStopError`): the
        fleet's summary, or None when fleet health is off."""
        if self._fleet is None:
            return None
        return await asyncio.to_thread(self._fleet.finish, stopped)

    async def arrive(
        self, token: str, seq: int, rank: int, kind: str, step: int, checkpoint: bool, world_size: int
    ) -> dict[int, Arrival]:
        """Wait until every rank of the attempt (`world_size` of them) has arrived at meeting
        (token, seq); return what each said."""
        m = self._meetings.setdefault((token, seq), _Meeting())
        m.arrivals[rank] = Arrival(kind, step, checkpoint)
        if self._fleet is not None:
            self._fleet.meeting(kind)
            if checkpoint:  # known here before Ray registers it (an action may choose it)
                self._fleet.checkpoint_announced(self.begin_attempt(token), step)
        if len(m.arrivals) >= world_size:
            m.done.set()
        await m.done.wait()
        return dict(m.arrivals)

    def arrived(self, token: str, seq: int) -> dict[int, Arrival]:
        """Who has arrived at meeting (token, seq) so far, and with what."""
        m = self._meetings.get((token, seq))
        return dict(m.arrivals) if m is not None else {}

    def rank0_closing(self, token: str) -> None:
        """Rank 0 of attempt `token` started closing its monitors after a failure."""
        self._rank0_closing.setdefault(token, asyncio.Event()).set()

    def rank0_closed(self, token: str) -> None:
        self._rank0_closed.setdefault(token, asyncio.Event()).set()

    async def wait_for_rank0(self, token: str, start_s: float, finish_s: float) -> bool:
        """For a failing rank: give rank 0 `start_s` to start closing its record and `finish_s`
        to finish, before Ray's teardown would kill it mid-write. True if rank 0 finished."""
        closing = self._rank0_closing.setdefault(token, asyncio.Event())
        closed = self._rank0_closed.setdefault(token, asyncio.Event())
        try:
            await asyncio.wait_for(closing.wait(), start_s)
            await asyncio.wait_for(closed.wait(), finish_s)
        except asyncio.TimeoutError:
            return False
        return True

    def add_report(self, per_rank: list[dict[str, Any]]) -> None:
        self._reports.append(per_rank)

    def add_exception(self, per_rank: dict[int, str]) -> str | None:
        """A failed attempt's errors; returns the `FleetStopError` message when an alarm's
        action stopped the fit (the controller raises it: head/ledger_callback.py)."""
        self._exceptions.append(per_rank)
        self._end_relays()  # the failed group's ranks are gone: nothing of it stays on their nodes
        attempt = max(len(self._attempts) - 1, 0)
        if self._goodput is not None:
            self._goodput.failed(attempt, per_rank, self._fleet.restart_cause(attempt) if self._fleet else None)
        if self._fleet is None:
            return None
        self._fleet.worker_errors(max(len(self._attempts) - 1, 0), per_rank)
        return self._fleet.stop_message()

    def set_record(self, monitor: str, path: str) -> None:
        self._records[monitor] = path

    def add_staging(self, staging: Staging) -> None:
        """Rank 0 stages a segment on its node (object storage): swept at the end (record/staging.py)."""
        self._staged.append(staging)

    def drop_staging(self, segment_path: str) -> None:
        """Rank 0 uploaded the closed segment and removed its staging folder."""
        self._staged = [s for s in self._staged if s.segment_path != segment_path]

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            reports=list(self._reports),
            exceptions=list(self._exceptions),
            records=dict(self._records),
            staged=list(self._staged),
        )

    # -------------------------------------------------------------- MLflow (head/mlflow_writer.py)
    def track_rows(self, prefix: str, offset: int, kind: str, payload: dict[str, Any]) -> None:
        if self._tracking is not None:
            self._tracking.rows(prefix, offset, kind, payload)

    def track_attempt(self, attempt: int, offset: int) -> None:
        if self._tracking is not None:
            self._tracking.attempt_started(attempt, offset, self._worlds.get(attempt))

    async def track_report(self, metrics: dict[str, Any], step: int | None, checkpoint: Any) -> None:
        if self._tracking is not None:  # writes the journal to storage: off the event loop
            await asyncio.to_thread(self._tracking.loop_report, metrics, step, checkpoint)

    def track_attempt_end(self) -> None:
        if self._tracking is not None:
            self._tracking.attempt_ended()

    async def finish_tracking(
        self, status: str, error: str | None, final_checkpoint: str | None
    ) -> TrackingOutcome | None:
        """The fit ended: the writer's last sync, or None when not tracked."""
        if self._tracking is None:
            return None
        return await asyncio.to_thread(self._tracking.finish, status, error, final_checkpoint)


def _data_median_and_max(data_s: np.ndarray) -> tuple[float | None, float | None]:
    """The median and the slowest rank's data wait of a check (NaN: not timed)."""
    timed = data_s[~np.isnan(data_s)]
    return (float(np.median(timed)), float(timed.max())) if timed.size else (None, None)


RunLedger = ray.remote(num_cpus=0)(Ledger)  # one actor per fit, on the head node (driver/trainer.py)
