"""The fit's timeline, kept by the run ledger on the head node, and its goodput while it trains.

The ledger (head/ledger.py) tells the keeper what it already sees, stamped with the head's clock:

    begin_attempt (rank 0 checks in)    -> attempt(n, world)
    goodput_clock (rank 0, every check) -> reading(n, ClockReading): the attempt's first step is
                                           placed at arrival - elapsed (the earliest arrival wins)
    goodput_failure (a rank's loop raised) -> rank_failed(n, steps): when the failure was first
                                           seen, and the most steps a rank had taken
    a complete fleet check              -> held_data(n, steps, p50, max): the slowest rank's data
                                           wait beyond the median rank's, which held the others
    add_exception (the controller)      -> failed(n, errors, fleet's cause): why and when it ended
    the driver's wind-down              -> close(ended, status): the account, final

It writes the timeline (record/fit_timeline.py) whole: at each attempt's start and end, at most
every WRITE_EVERY_S between, on a thread of its own, and at the close. While the fit trains,
every reading refreshes Ray's gauges, and at most every WRITE_EVERY_S the MLflow run gets
`goodput/*` metrics: the fit's goodput so far, the last 15 minutes', and the seconds per bucket.

    ray_ormas_goodput{run, window="fit"|"15m"}     productive time over wall time
    ray_ormas_goodput_seconds{run, bucket}         seconds per bucket so far (record/goodput.py BUCKETS)

Hooks relied on: `ray.util.metrics.Gauge`; the MLflow writer's `fleet(entries)` (head/mlflow_writer.py).
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.fit_timeline import (
    AttemptTimes,
    ClockReading,
    FitTimeline,
    write_timeline,
)
from ray_ormas._internal.record.goodput import BUCKETS, GoodputAccount, account_of, steady_of
from ray_ormas._internal.record.store import RecordStore

logger = get_logger("ray_ormas.goodput")

WRITE_EVERY_S = 60.0  # the timeline on storage, and goodput/* in MLflow, at most this often
ROLLING_S = 15 * 60.0  # the rolling window
MEDIANS_KEPT = 512  # the readings' step medians kept per attempt (the steady step time's)
GOODPUT = "ormas_goodput"
SECONDS = "ormas_goodput_seconds"


@dataclass(frozen=True)
class GoodputSpec:
    """What the keeper needs from the driver: the fit, where its record is, and when `fit()` was called."""

    fit_id: str
    store: RecordStore
    run_name: str | None
    started: float


class GoodputKeeper:
    """One fit's timeline and live goodput (see the module docstring). Called on the ledger's
    event loop; its writes and exports never raise."""

    def __init__(self, spec: GoodputSpec, tracking: Any = None) -> None:
        self._spec = spec
        self._tracking = tracking
        self.timeline = FitTimeline(fit_id=spec.fit_id, run_name=spec.run_name, started=spec.started)
        self._attempts: dict[int, AttemptTimes] = {}
        self._medians: dict[int, deque[float]] = {}
        self._gaps: dict[int, deque[float]] = {}  # attempt -> the seconds between its readings
        self._samples: deque[tuple[float, float]] = deque()  # (time, productive seconds so far)
        self._last_export = 0.0
        self._last_write = 0.0
        self._writing: threading.Thread | None = None
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._gauges: dict[str, Any] | None = None

    # ------------------------------------------------------------------ events
    def attempt(self, attempt: int, world: int | None) -> None:
        """Rank 0 of a new attempt checked in."""
        now = time.time()
        times = self._attempts.get(attempt)
        if times is None:
            times = self._attempts[attempt] = AttemptTimes(attempt=attempt, world=world, checked_in=now)
            self.timeline.attempts.append(times)
            self._write_soon(now, at_once=True)
        elif world is not None:
            times.world = world

    def reading(self, attempt: int, reading: ClockReading, step_offset: int) -> None:
        """Rank 0's clock at a check (or at the loop's end)."""
        now = time.time()
        times = self._attempts.get(attempt)
        if times is None:
            self.attempt(attempt, None)
            times = self._attempts[attempt]
        placed = now - reading.elapsed_s - (reading.closing_s if reading.ended else 0.0)
        times.clock_at = placed if times.clock_at is None else min(times.clock_at, placed)
        if times.seen_at is not None and not reading.ended:
            gaps = self._gaps.setdefault(attempt, deque(maxlen=MEDIANS_KEPT))
            gaps.append(now - times.seen_at)
            times.check_every_s = statistics.median(gaps)
        times.seen_at = now
        times.step_offset = step_offset
        times.reading = {f: getattr(reading, f) for f in reading.__slots__}
        if reading.step_s is not None and not reading.ended:
            medians = self._medians.setdefault(attempt, deque(maxlen=MEDIANS_KEPT))
            medians.append(reading.step_s)
            times.steady_s = steady_of(list(medians))
        self._live(now, at_once=reading.ended)

    def held_data(self, attempt: int, steps: int, data_p50: float | None, data_max: float | None) -> None:
        """A complete fleet check: the slowest rank's data wait beyond the median rank's, over
        the `steps` since the check before."""
        times = self._attempts.get(attempt)
        if times is not None and data_p50 is not None and data_max is not None and steps > 0:
            times.held_data_s += max(0.0, data_max - data_p50) * steps

    def rank_failed(self, attempt: int, steps: int) -> None:
        """A rank's loop raised (it saw the failure: its own error, or a peer gone), `steps` in."""
        times = self._attempts.get(attempt)
        if times is None:
            return
        now = time.time()
        times.failed_seen_at = now if times.failed_seen_at is None else min(times.failed_seen_at, now)
        times.failed_steps = steps if times.failed_steps is None else max(times.failed_steps, steps)

    def failed(self, attempt: int, errors: dict[int, str], fleet_cause: tuple[str, float] | None) -> None:
        """The controller saw `attempt` fail; `fleet_cause`: (alarm and action, the alarm's
        time) when a fleet action ended it."""
        now = time.time()
        times = self._attempts.get(attempt)
        if times is None:
            self.attempt(attempt, None)
            times = self._attempts[attempt]
        if times.ended_at is not None:
            return
        times.ended_at = now
        first = errors[min(errors)] if errors else None
        times.error = first[:300] if first else None
        if fleet_cause is not None:
            times.cause, times.alarm_at = fleet_cause
        else:
            times.cause = failure_cause(first or "")
        self._write_soon(now, at_once=True)

    def close(self, ended: float, status: str) -> GoodputAccount:
        """The fit ended (`ended`: the driver's clock, at its wind-down): the account, final;
        the timeline written (in the caller's thread)."""
        with self._lock:
            if self.timeline.closed is None:  # the wind-down: what MLflow and run.html show
                self.timeline.closed = max(ended, self.timeline.started)
            else:  # fit() returns: the record's and the result's account run to here
                self.timeline.returned = max(ended, self.timeline.closed)
            self.timeline.status = status
        account = self._account(ended)
        self._export(account, ended)
        self._join_writer()
        try:
            write_timeline(self._spec.store, self.timeline)
        except Exception as e:  # telemetry: the account is still returned
            self._say("write", e)
        return account

    # ------------------------------------------------------------------ live
    def _account(self, now: float) -> GoodputAccount:
        account = account_of(self.timeline, now)
        self._samples.append((now, account.buckets["productive"]))
        while self._samples and now - self._samples[0][0] > ROLLING_S:
            self._samples.popleft()
        oldest = self._samples[0]
        rolling = None
        if now - self.timeline.started >= ROLLING_S and now > oldest[0]:
            rolling = (account.buckets["productive"] - oldest[1]) / (now - oldest[0])
        return GoodputAccount(
            wall_s=account.wall_s,
            buckets=account.buckets,
            restarts=account.restarts,
            attempts=account.attempts,
            started=account.started,
            closed=account.closed,
            last_15m=rolling,
        )

    def _live(self, now: float, at_once: bool = False) -> None:
        try:
            account = self._account(now)
        except Exception as e:  # a malformed reading must not take the ledger down
            self._say("account", e)
            return
        self._gauge(account)
        if at_once or now - self._last_export >= WRITE_EVERY_S:
            self._export(account, now)
        self._write_soon(now, at_once)

    def _gauge(self, account: GoodputAccount) -> None:
        try:
            if self._gauges is None:
                from ray.util.metrics import Gauge

                self._gauges = {
                    GOODPUT: Gauge(
                        GOODPUT,
                        description="ray-ormas goodput: productive time over wall time",
                        tag_keys=("run", "window"),
                    ),
                    SECONDS: Gauge(
                        SECONDS,
                        description="ray-ormas seconds of the fit by goodput bucket",
                        tag_keys=("run", "bucket"),
                    ),
                }
            run = self._spec.run_name or self._spec.fit_id
            if account.goodput is not None:
                self._gauges[GOODPUT].set(account.goodput, tags={"run": run, "window": "fit"})
            if account.last_15m is not None:
                self._gauges[GOODPUT].set(account.last_15m, tags={"run": run, "window": "15m"})
            for bucket in BUCKETS:
                self._gauges[SECONDS].set(account.buckets[bucket], tags={"run": run, "bucket": bucket})
        except Exception as e:  # telemetry never breaks training
            self._say("gauges", e)

    def _export(self, account: GoodputAccount, now: float) -> None:
        """goodput/* to the MLflow run, at the run step of the latest reading."""
        self._last_export = now
        if self._tracking is None or account.goodput is None:
            return
        step = max(
            (a.step_offset + int((a.reading or {}).get("steps") or 0) for a in self.timeline.attempts), default=0
        )
        entries = [("goodput/fit", account.goodput, step)]
        if account.last_15m is not None:
            entries.append(("goodput/last_15m", account.last_15m, step))
        entries += [(f"goodput/{b}_s", account.buckets[b], step) for b in BUCKETS]
        try:
            self._tracking.fleet(entries)
        except Exception as e:  # telemetry never breaks training
            self._say("mlflow", e)

    def _write_soon(self, now: float, at_once: bool = False) -> None:
        """The timeline to storage on a thread of its own (one at a time; the next waits its turn)."""
        if not at_once and now - self._last_write < WRITE_EVERY_S:
            return
        if self._writing is not None and self._writing.is_alive():
            return
        self._last_write = now
        self._writing = threading.Thread(target=self._write, name="ray-ormas-goodput-write", daemon=True)
        self._writing.start()

    def _write(self) -> None:
        try:
            with self._lock:
                data = FitTimeline.from_json(self.timeline.to_json(), "the timeline")  # a copy, whole
            write_timeline(self._spec.store, data)
        except Exception as e:  # telemetry never breaks training
            self._say("write", e)

    def _join_writer(self) -> None:
        if self._writing is not None:
            self._writing.join(timeout=30)

    def _say(self, what: str, e: Exception) -> None:
        if what not in self._said:
            self._said.add(what)
            logger.warning("goodput: could not %s (%s: %s); training goes on", _WHAT[what], type(e).__name__, e)


_WHAT = {
    "write": "write the fit's timeline to the record",
    "account": "compute the account from a reading",
    "gauges": "export the goodput gauges to Ray",
    "mlflow": "hand goodput/* to the MLflow writer",
}


def failure_cause(error: str) -> str:
    """A failed attempt's cause from its first failing rank's error (docs/goodput.md)."""
    if "preempt" in error.lower():
        return "preemption"
    if NODE_DIED.search(error):
        return "node failure"
    return "worker failure"


# Ray's words for an actor whose node went away ("The actor died because its node has died").
NODE_DIED = re.compile(r"its node has died|node (?:has |was )?(?:died|lost|removed)|marked (?:as )?dead|NodeDied", re.I)
