"""The head node's hang watch: a `hang` alarm when no rank has reached the fleet's next check.

Pure Python, no Ray, no torch, no clock of its own (the caller passes `now`): the fleet head
(head/fleet_head.py) tells it when each rank reached each check of an attempt, when an attempt
starts or ends, and when the loop winds down, and polls it about once a second.

A stall is counted from the moment the latest check was reached by its first rank: when
`bound_s` seconds pass and no rank has reached a later check, the watch returns one alarm,
naming the ranks that reached the latest check and those that did not (under DDP a rank stuck
before its backward holds the others in the all-reduce: all of them reached the previous
check and none the next). One alarm per stall: the next check that any rank reaches ends it.

The bound is `hang_after_s` when the settings give it; otherwise it is derived from the run's
own pace: `DERIVED_FACTOR` times the longest interval seen so far between one check and the
next in this fit, and never less than `DERIVED_FLOOR_S`. Nothing is watched before an attempt's
first check (model building and data loading take what they take), between attempts, from a
report to the next check (a checkpoint upload is not a hang), or once a rank's loop has ended.

The steps between an attempt's first check and its second are its warm-up (the first backward
passes, lazy allocations, autotuning and compilation of new shapes, a busy node while Ray starts
the group's processes): there the bound is never less than `WARM_UP_FLOOR_S`, and that interval
does not count in the run's pace. A rank stuck there is still named, after the floor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ray_ormas._internal.common.fleet_records import FleetAlarm

DERIVED_FACTOR = 10.0
DERIVED_FLOOR_S = 120.0
WARM_UP_FLOOR_S = 120.0  # the least bound between an attempt's first check and its second


@dataclass
class StallWatch:
    """One fit's hang watch (see the module docstring)."""

    hang_after_s: float | None = None  # None: derived from the run's pace
    world: int = 1  # the ranks of an attempt when the caller does not say
    _attempt: int | None = None
    _ranks: int = 1
    _check: int = -1  # the latest check any rank reached in this attempt
    _first_check: int | None = None  # the attempt's first check: until a later one, its warm-up
    _step: int | None = None  # its step in the attempt's segment
    _since: float | None = None  # when its first rank reached it
    _reached: set[int] = field(default_factory=set)
    _longest_gap_s: float = 0.0
    _alarmed: bool = False
    _watching: bool = False

    def attempt_started(self, attempt: int, world: int | None = None) -> None:
        """Attempt `attempt` runs on `world` ranks: nothing is watched until its first check (said
        again for an attempt already seen, e.g. after its first check arrived, only the size changes)."""
        if attempt == self._attempt:
            self._ranks = world or self._ranks
            return
        self._attempt, self._ranks = attempt, world or self.world
        self._check, self._step, self._since, self._reached = -1, None, None, set()
        self._first_check, self._alarmed, self._watching = None, False, True

    def attempt_ended(self) -> None:
        """The attempt failed or was stopped: Ray restarts the group or the fit ends."""
        self._watching = False

    def winding_down(self) -> None:
        """A rank's loop has ended: what follows (uploads, the last report) is not a hang."""
        self._watching = False

    def reporting(self) -> None:
        """A rank reports (a checkpoint may upload for minutes): the stall clock waits for the next check."""
        self._since = None

    def reached(self, attempt: int, rank: int, check: int, now: float, step: int | None = None) -> None:
        """Rank `rank` reached check `check` (at `step` of the attempt's segment) of attempt `attempt` at `now`."""
        if self._attempt is not None and attempt < self._attempt:
            return  # a late word from an attempt that has ended
        if attempt != self._attempt:
            self.attempt_started(attempt)
        if self._first_check is None:
            self._first_check = check
        if check > self._check:
            if self._since is not None and self._check >= 0 and not self.warming_up():  # not across a report
                self._longest_gap_s = max(self._longest_gap_s, now - self._since)
            self._check, self._step, self._since, self._reached, self._alarmed = check, step, now, {rank}, False
        elif check == self._check:
            self._reached.add(rank)

    def reached_all(self, attempt: int, ranks: list[int], check: int, now: float, step: int | None = None) -> None:
        """`reached` for several ranks at once (a node's relay sends them together)."""
        if not ranks:
            return
        self.reached(attempt, ranks[0], check, now, step)
        if attempt == self._attempt and check == self._check:
            self._reached.update(ranks)

    def warming_up(self) -> bool:
        """Whether no rank has passed the attempt's first check yet (see the module docstring)."""
        return self._first_check is not None and self._check == self._first_check

    def bound_s(self) -> float:
        """Seconds without a new check before the alarm."""
        if self.hang_after_s is not None:
            bound = self.hang_after_s
        else:
            bound = max(DERIVED_FLOOR_S, DERIVED_FACTOR * self._longest_gap_s)
        return max(bound, WARM_UP_FLOOR_S) if self.warming_up() else bound

    def poll(self, now: float) -> FleetAlarm | None:
        """The hang alarm, once per stall, when no rank has reached a later check for `bound_s()`."""
        if not self._watching or self._alarmed or self._since is None or self._attempt is None:
            return None
        waited = now - self._since
        bound = self.bound_s()
        if waited < bound:
            return None
        self._alarmed = True
        reached = sorted(self._reached)
        missing = sorted(set(range(self._ranks)) - self._reached)
        warm_up = self.warming_up()
        return stall_alarm(self._attempt, self._check, self._step, reached, missing, waited, bound, warm_up)


def stall_alarm(
    attempt: int,
    check: int,
    step: int | None,
    reached: list[int],
    missing: list[int],
    waited_s: float,
    bound_s: float,
    warm_up: bool = False,
) -> FleetAlarm:
    """A fleet alarm for a stall: its `ranks` are those that did not reach the latest check (all
    of them when every rank reached it and none the next), `reached` those that did."""
    stuck = missing or reached
    why = ", the attempt's warm-up: its first check and none after it" if warm_up else ""
    said = f"ranks {_ranks(reached)} reached check {check}" + (
        f", ranks {_ranks(missing)} did not" if missing else ", and none has reached a later one"
    )
    return FleetAlarm(  # its run step: the fleet head adds the attempt's offset
        attempt=attempt,
        check=check,
        step=step,
        kind="hang",
        ranks=tuple(stuck),
        reached=tuple(reached),
        message=f"no rank has reached a new check for {waited_s:.0f} s (the bound is {bound_s:g} s{why}): {said}",
        time=time.time(),
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"
