"""Where a fit's time went: its goodput account, from its timeline alone (record/fit_timeline.py).

The wall time from `fit()`'s call to its return is cut into consecutive spans on the head's
clock, and each span into buckets (docs/goodput.md gives each bucket's source):

    fit() called ............ attempt 0's first step      start_up
    each attempt, first step .. its last reading          productive, warm_up, data_wait,
                                                          checkpoint, monitoring, lost_progress
                                                          (rank 0's clock, and the fleet's data times)
    its last reading .. its failure                       hang (to a hang alarm), restart (the alarm's
                                                          action), lost_progress (steps past the last
                                                          check, redone), productive (kept by a later
                                                          checkpoint)
    its failure .. the next attempt's first step          restart, by cause
    the loop's end .. fit() returns                       monitoring (the record's close), wind_down
    whatever is not in a bucket                           other

so the buckets add up to the wall time; `other` is what the clocks could not place (small, and
shown). Goodput is productive over wall time. Pure Python, no Ray, no torch.

Hooks relied on: none.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ray_ormas._internal.record.fit_timeline import AttemptTimes, FitTimeline, read_timelines
from ray_ormas._internal.record.store import RecordStore

BUCKETS = (
    "productive",
    "start_up",
    "warm_up",
    "data_wait",
    "checkpoint",
    "restart",
    "lost_progress",
    "hang",
    "monitoring",
    "wind_down",
    "other",
)
LOST = BUCKETS[1:]  # every bucket but productive is time that did not train the kept model
RESIZE = "elastic resize"


@dataclass(frozen=True)
class RestartCost:
    """One restart: the attempt that ended, why, and what it cost.

    Attributes:
        attempt: the attempt that ended (the next one restarted it).
        cause: "worker failure", "node failure", "preemption", "elastic resize", or a fleet
            action with its alarm ("divergence reattempt", "straggler evict", "hang reattempt").
        restart_s: from the failure (or the alarm whose action ended it) to the next attempt's
            first step.
        lost_s: the progress redone: steps trained after the checkpoint the next attempt resumed from.
        lost_steps: how many steps that was, as measured at the attempt's last check.
        error: the failing rank's error, cut short (a failure).
    """

    attempt: int
    cause: str
    restart_s: float
    lost_s: float
    lost_steps: int
    error: str | None = None


@dataclass(frozen=True)
class AttemptGoodput:
    """One attempt's part of the fit's wall time: from where the one before ended (the fit's
    start for attempt 0) to its own end."""

    attempt: int
    world: int | None
    began: float
    ended: float
    steps: int
    steady_step_s: float | None
    buckets: dict[str, float]

    @property
    def wall_s(self) -> float:
        return self.ended - self.began

    @property
    def goodput(self) -> float | None:
        return self.buckets["productive"] / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class GoodputAccount:
    """Where the time of a fit, or of a whole run, went (`result.ormas.goodput`).

    Attributes:
        wall_s: from `fit()`'s call to its return (a run: the sum over its fits).
        buckets: seconds per bucket (`BUCKETS`), adding up to `wall_s`.
        restarts: one `RestartCost` per restart, oldest first.
        attempts: each attempt's own account (a run: every fit's, in order).
        fits: the fits counted (1 for a fit; a run's continuations).
        started: when the (first) fit was called, Unix seconds.
        closed: False while the fit runs (a live account, up to now).
        last_15m: goodput over the last 15 minutes of training (None: the fit was shorter).
    """

    wall_s: float
    buckets: dict[str, float]
    restarts: tuple[RestartCost, ...] = ()
    attempts: tuple[AttemptGoodput, ...] = ()
    fits: int = 1
    started: float = 0.0
    closed: bool = True
    last_15m: float | None = None

    @property
    def goodput(self) -> float | None:
        """Productive time over wall time (0..1); None before any time passed."""
        return self.buckets["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def restart_by_cause(self) -> dict[str, float]:
        """Restart seconds by cause."""
        out: dict[str, float] = {}
        for r in self.restarts:
            out[r.cause] = out.get(r.cause, 0.0) + r.restart_s
        return out

    def lost_s(self) -> float:
        return self.wall_s - self.buckets["productive"]

    def line(self) -> str:
        """One line for the console: 'goodput 81%: 6 min lost to 2 restarts (...), ...'."""
        if self.goodput is None:
            return "goodput: no time measured"
        parts = []
        restart = self.buckets["restart"] + self.buckets["lost_progress"] + self.buckets["hang"]
        if self.restarts:
            causes = ", ".join(_counted(self.restarts))
            n = len(self.restarts)
            parts.append(f"{duration(restart)} lost to {n} restart{'s' if n != 1 else ''} ({causes})")
        named = (
            ("checkpoint", "checkpoints"),
            ("start_up", "start-up"),
            ("data_wait", "data wait"),
            ("warm_up", "warm-up"),
            ("monitoring", "monitoring"),
            ("wind_down", "wind-down"),
        )
        biggest = sorted(((self.buckets[b], text) for b, text in named), reverse=True)
        parts += [f"{duration(s)} to {text}" for s, text in biggest if s >= max(0.5, 0.01 * self.wall_s)][:4]
        head = f"goodput {self.goodput:.0%} of {duration(self.wall_s)}"
        return head + (": " + ", ".join(parts) if parts else "")

    def table(self) -> str:
        """The buckets as a text table (seconds, share of the wall time), then the restarts."""
        lines = [f"{'bucket':<14}{'seconds':>10}{'share':>8}"]
        for bucket in BUCKETS:
            seconds = self.buckets[bucket]
            share = seconds / self.wall_s if self.wall_s > 0 else 0.0
            lines.append(f"{bucket:<14}{seconds:>10.1f}{share:>8.1%}")
        lines.append(f"{'wall':<14}{self.wall_s:>10.1f}")
        for r in self.restarts:
            lost = f", {r.lost_s:.1f} s of progress redone ({r.lost_steps} steps)" if r.lost_s else ""
            lines.append(f"restart after attempt {r.attempt}: {r.cause}, {r.restart_s:.1f} s{lost}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The account as plain data (what `ray-ormas goodput RUN --json` prints)."""
        return {
            "goodput": self.goodput,
            "wall_s": self.wall_s,
            "fits": self.fits,
            "closed": self.closed,
            "last_15m": self.last_15m,
            "buckets": dict(self.buckets),
            "restart_by_cause": self.restart_by_cause,
            "restarts": [r.__dict__ for r in self.restarts],
            "attempts": [
                {
                    "attempt": a.attempt,
                    "world": a.world,
                    "wall_s": a.wall_s,
                    "goodput": a.goodput,
                    "steps": a.steps,
                    "steady_step_s": a.steady_step_s,
                    "buckets": a.buckets,
                }
                for a in self.attempts
            ],
        }


def duration(seconds: float) -> str:
    """'40 s', '6 min', '2.5 h'."""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _counted(restarts: tuple[RestartCost, ...]) -> list[str]:
    seen: dict[str, int] = {}
    for r in restarts:
        seen[r.cause] = seen.get(r.cause, 0) + 1
    return [f"{n} {cause}" if n > 1 else f"a {cause}" for cause, n in seen.items()]


@dataclass
class _Cut:
    """The buckets of one attempt, filled span by span."""

    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))

    def add(self, bucket: str, seconds: float) -> float:
        seconds = max(0.0, seconds)
        self.buckets[bucket] += seconds
        return seconds


def account_of(timeline: FitTimeline, now: float | None = None) -> GoodputAccount:
    """The fit's account, up to `fit()`'s return (or its wind-down, the close before it; or
    `now`, for a fit that still runs)."""
    closed = timeline.returned if timeline.returned is not None else timeline.closed
    end = closed if closed is not None else (now if now is not None else _last_time(timeline))
    attempts = sorted(timeline.attempts, key=lambda a: a.attempt)
    cursor = timeline.started
    cuts: list[AttemptGoodput] = []
    restarts: list[RestartCost] = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        cut, began = _Cut(), cursor
        first = min(max(a.clock_at if a.clock_at is not None else _never_stepped_until(a, nxt, end), cursor), end)
        gap = cut.add("start_up" if i == 0 else "restart", first - cursor)
        if restarts and i > 0:  # the restart that led here runs to this attempt's first step
            restarts[-1] = _with_restart(restarts[-1], gap)
        cursor = first
        restarted = nxt is not None and a.cause is not None
        resumed_at = nxt.step_offset if restarted and nxt is not None else None
        lost, lost_steps, per_step = 0.0, 0, a.steady_s or 0.0
        reading = a.reading or {}
        if reading:
            cursor, lost, lost_steps, per_step = _trained(cut, a, reading, resumed_at, end - cursor, cursor)
        if a.ended_at is not None and a.cause is not None:  # it failed, or an action ended it
            failed = min(max(a.ended_at, cursor), end)
            tail_lost, tail_restart = _tail(cut, a, cursor, failed, resumed_at, per_step, nxt is not None)
            lost += tail_lost
            if a.failed_steps is not None and resumed_at is not None:
                lost_steps = max(0, a.step_offset + a.failed_steps - resumed_at)
            cursor = failed
            if nxt is not None:  # else the fit failed: nothing restarted it (its loss is in lost_progress)
                restarts.append(RestartCost(a.attempt, a.cause, tail_restart, lost, lost_steps, a.error))
        elif nxt is not None:  # it ended without a failure: Ray's controller restarted it (a resize)
            restarts.append(RestartCost(a.attempt, RESIZE, 0.0, 0.0, 0))
        if nxt is None:
            cut.add("wind_down", end - cursor)
            cursor = end
        cuts.append(
            AttemptGoodput(
                attempt=a.attempt,
                world=a.world,
                began=began,
                ended=cursor,
                steps=int(reading.get("steps") or 0),
                steady_step_s=a.steady_s,
                buckets=cut.buckets,
            )
        )
    totals = dict.fromkeys(BUCKETS, 0.0)
    for c in cuts:
        for b, sec in c.buckets.items():
            totals[b] += sec
    wall = max(0.0, end - timeline.started)
    if not cuts:
        totals["start_up"] = wall  # nothing began: the fit never reached a worker
    totals["other"] += wall - sum(totals.values())
    return GoodputAccount(
        wall_s=wall,
        buckets=totals,
        restarts=tuple(_resized(restarts, attempts)),
        attempts=tuple(cuts),
        started=timeline.started,
        closed=timeline.closed is not None,
    )


def _trained(
    cut: _Cut, a: AttemptTimes, reading: dict[str, Any], resumed_at: int | None, room: float, cursor: float
) -> tuple[float, float, int, float]:
    """The attempt's measured span, from its first step to its last reading, into `cut`. Returns
    (the span's end, the progress lost in it, its steps redone, its steady step time).

    The steps redone (from the checkpoint the next attempt resumed from to the last reading) cost
    the steady step each (`_steady_step`), in compute, data wait and monitoring alike: lost progress."""
    span = min(float(reading["elapsed_s"]), room)
    steps = max(int(reading["steps"]), 1)
    # The worker's step times include waiting in the all-reduce for a rank slow in its data: that
    # wait is the data bucket's (`held`), so it comes out of the compute and the steady step too.
    held = min(a.held_data_s, float(reading["compute_s"]))
    compute = float(reading["compute_s"]) - held
    data, monitor = float(reading["data_s"]) + held, float(reading["monitor_s"])
    steady = max(0.0, a.steady_s - held / steps) if a.steady_s is not None else None
    warm = 0.0
    if steady is not None and reading.get("first_steps"):
        warm = min(max(0.0, float(reading["first_compute_s"]) - int(reading["first_steps"]) * steady), compute)
    parts = {"productive": compute - warm, "data_wait": data, "monitoring": monitor}
    per_part = _steady_step(parts, reading.get("first_step"), steps)
    lost_steps = max(0, a.step_offset + int(reading["steps"]) - resumed_at) if resumed_at is not None else 0
    redone = {b: min(lost_steps * per_part[b], total) for b, total in parts.items()}
    lost = sum(redone.values())
    placed = cut.add("data_wait", data - redone["data_wait"])
    placed += cut.add("monitoring", monitor - redone["monitoring"])
    placed += cut.add("checkpoint", float(reading["report_s"]))
    placed += cut.add("warm_up", warm)
    placed += cut.add("lost_progress", lost)
    placed += cut.add("productive", parts["productive"] - redone["productive"])
    cut.add("other", span - placed)
    end = cursor + span
    if reading.get("ended"):
        end += cut.add("monitoring", min(float(reading.get("closing_s") or 0.0), room - span))
    return end, lost, lost_steps, sum(per_part.values())


def _steady_step(parts: dict[str, float], first_step: Any, steps: int) -> dict[str, float]:
    """What a step redone costs, per bucket: the attempt's steps after the first, on average. The
    first step's data wait and monitoring are one-offs (the loop's set-up after the monitor's
    attach, the loader's start, the first check) that a step redone does not repeat; its compute
    beyond the steady step is already out, as warm-up. A reading without the first step's parts
    (a record written before they were sent), or of one step, gives the plain mean."""
    if not first_step or steps < 2:
        return {b: sec / steps for b, sec in parts.items()}
    _, first_data, first_monitor = (float(x) for x in first_step)
    return {
        "productive": parts["productive"] / steps,
        "data_wait": max(0.0, parts["data_wait"] - first_data) / (steps - 1),
        "monitoring": max(0.0, parts["monitoring"] - first_monitor) / (steps - 1),
    }


def _tail(
    cut: _Cut,
    a: AttemptTimes,
    cursor: float,
    failed: float,
    resumed_at: int | None,
    per_step: float,
    restarting: bool,
) -> tuple[float, float]:
    """From the attempt's last reading to its failure, into `cut`; returns (the progress lost in
    it, the restart's part of it). A hang: to the alarm, hang; then the action, restart. Else the
    steps after the last check were trained, then redone unless a later checkpoint kept them:
    as many as a surviving rank had taken when it saw the failure (at the steady step time); without
    one, half a check interval (the failure's expected place in it). The rest, until Ray's
    controller reported the failure, is the restart's (the wind-down's when nothing restarts)."""
    tail = failed - cursor
    if a.alarm_at is not None and (a.cause or "").startswith("hang"):
        hang = cut.add("hang", min(max(a.alarm_at - cursor, 0.0), tail))
        return 0.0, cut.add("restart" if restarting else "wind_down", tail - hang)
    at_reading = a.step_offset + int((a.reading or {}).get("steps") or 0)
    if a.failed_steps is not None and a.reading:
        trained = min(tail, max(0, a.step_offset + a.failed_steps - at_reading) * per_step)
    else:
        trained = min(tail, 0.5 * (a.check_every_s or 0.0))
    kept = min(trained, max(0, resumed_at - at_reading) * per_step) if resumed_at is not None else 0.0
    cut.add("productive", kept)
    lost = cut.add("lost_progress", trained - kept)
    return lost, cut.add("restart" if restarting else "wind_down", tail - trained)


def _never_stepped_until(a: AttemptTimes, nxt: AttemptTimes | None, end: float) -> float:
    """Where an attempt that never took a step ends: its failure, or the next one's check-in."""
    if a.ended_at is not None:
        return a.ended_at
    if nxt is not None and nxt.checked_in is not None:
        return nxt.checked_in
    return end


def _with_restart(r: RestartCost, gap: float) -> RestartCost:
    return RestartCost(r.attempt, r.cause, r.restart_s + gap, r.lost_s, r.lost_steps, r.error)


def _resized(restarts: list[RestartCost], attempts: list[AttemptTimes]) -> list[RestartCost]:
    """A restart at another world size is an elastic resize, whatever ended the attempt before
    (the failure stays in its `error`)."""
    worlds = {a.attempt: a.world for a in attempts}
    out = []
    for r in restarts:
        before, after = worlds.get(r.attempt), worlds.get(r.attempt + 1)
        resized = before is not None and after is not None and before != after
        out.append(
            RestartCost(r.attempt, RESIZE, r.restart_s, r.lost_s, r.lost_steps, r.error or r.cause)
            if resized and r.cause != RESIZE
            else r
        )
    return out


def _last_time(t: FitTimeline) -> float:
    times = [x for a in t.attempts for x in (a.seen_at, a.ended_at, a.checked_in) if x is not None]
    return max([t.started, *times])


def run_account(store: RecordStore) -> GoodputAccount | None:
    """The whole run's account: every fit under the record root (continuations, reruns), summed."""
    return combined([account_of(t) for t in read_timelines(store)])


def combined(accounts: list[GoodputAccount]) -> GoodputAccount | None:
    """Several fits' accounts as one (their wall times and buckets summed)."""
    if not accounts:
        return None
    totals = dict.fromkeys(BUCKETS, 0.0)
    for acc in accounts:
        for b, s in acc.buckets.items():
            totals[b] += s
    return GoodputAccount(
        wall_s=sum(a.wall_s for a in accounts),
        buckets=totals,
        restarts=tuple(r for a in accounts for r in a.restarts),
        attempts=tuple(x for a in accounts for x in a.attempts),
        fits=len(accounts),
        started=min(a.started for a in accounts),
        closed=all(a.closed for a in accounts),
    )


def goodput_entries(account: GoodputAccount, step: int) -> list[tuple[str, float, int]]:
    """The account as MLflow metrics at run step `step`: `goodput/fit`, `goodput/last_15m`
    (when known), and `goodput/<bucket>_s`."""
    out: list[tuple[str, float, int]] = []
    if account.goodput is not None:
        out.append(("goodput/fit", account.goodput, step))
    if account.last_15m is not None:
        out.append(("goodput/last_15m", account.last_15m, step))
    return out + [(f"goodput/{b}_s", account.buckets[b], step) for b in BUCKETS]


def goodput_params(account: GoodputAccount) -> dict[str, str]:
    """The closed account as MLflow params (`goodput.*`): the goodput, the wall time, each
    bucket's seconds, the restarts and their causes."""
    out = {
        "goodput.fit": f"{account.goodput:.4f}" if account.goodput is not None else "",
        "goodput.wall_s": f"{account.wall_s:.1f}",
        **{f"goodput.{b}_s": f"{account.buckets[b]:.1f}" for b in BUCKETS},
        "goodput.restarts": str(len(account.restarts)),
    }
    if account.restarts:
        out["goodput.restart_causes"] = ", ".join(_counted(account.restarts))
    return out


def steady_of(window_medians: list[float]) -> float | None:
    """The steady step time of an attempt: the median of its readings' medians after the first
    (the first window is the warm-up); the first's alone when there is no other."""
    later = window_medians[1:] or window_medians[:1]
    return statistics.median(later) if later else None
