"""The head node's view of the fleet: every rank's facts at a check turned into scores and alarms.

No Ray, no torch: the run ledger (head/ledger.py) feeds it what the ranks send at each check
(worker/fleet_probe.py): the nodes' relays' packed rows (`add_rows`, fleet/wire.py), or a rank's
whole facts (`add`). The head writes what it returns to the fleet record, MLflow and Ray's metrics.
A complete check is analysed as columns (fleet/check_columns.py, numpy): the work per rank is
numpy's, and Python's only for the ranks an alarm names (bench/components/fleet_scale.py and
fleet_messages.py measure it at up to 10,000 ranks).

Per check, once every rank's facts are in:

* **Straggler score** of rank r, for its busy time b = data_s + forward_s (the part of a step a
  rank spends before it waits on the others): `relative` = median of the *other* ranks' b over
  its own b, `individual` = its own best b so far over its current b; both capped at 1 (1 = as
  fast as the others / as its best). The first check of an attempt is warm-up and not scored.
  A rank is *slow* at a check when relative < `slow_score` and its excess b - median is at least
  `min_excess` x the fleet's median step (wall) time. `slow_checks` slow checks in a row raise a
  `straggler` alarm naming the rank, its node and what is slow: `data` or `compute`, whichever
  component exceeds the others' median more. After `slow_checks` checks in a row that are not
  slow, `straggler_recovered` (the same N both ways, so one noisy check does not end an episode).
* **Divergence** (DDP): the ranks whose parameter digest differs from the majority's, and the
  first parameter group whose digests differ (a layer's name when a group holds one parameter).
  One alarm per episode and attempt (a restarted group in which it comes back, before a clean
  check, is alarmed again); `divergence_resolved` when the digests agree again.
* **Non-finite**: the ranks whose loss is NaN/Inf (the source, under DDP: their gradients reach
  every rank through the all-reduce), else the ranks with non-finite gradients, with the step and
  the layers. One alarm per episode and attempt, as for divergence.
* **Loss**: the mean of the ranks' finite losses, beside rank 0's.

When the facts come through the nodes' relays (`groups_on_request`), they carry no parameter-group
digests. A complete check whose digests differ (a new divergence) is then *held*, and the checks
of its attempt after it wait behind it (checks are evaluated in order): `wanted_groups` names the
two ranks whose group digests locate it, `add_groups` takes them, and `release` gives up on them
(the divergence is alarmed, not located). So the alarm keeps its check, beside the check's other
alarms, and the most severe of them acts.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ray_ormas._internal.common.fleet_records import FleetAlarm, RankRow
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.fleet.check_columns import CheckColumns
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import ROW, Intro, rows_at, unpack

KEEP_PENDING_CHECKS = 8  # checks waiting for missing ranks are dropped beyond this many
KEEP_INTRO_ATTEMPTS = 2  # the attempts whose ranks' intros are kept (the current one and the one before)


@dataclass
class _RankStates:
    """The straggler state of one attempt's ranks, a slot per rank number."""

    best_busy: np.ndarray = field(default_factory=lambda: np.empty(0))
    streak: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # slow checks in a row
    fast_streak: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # checks in a row not slow
    alarmed: np.ndarray = field(default_factory=lambda: np.empty(0, bool))

    def fit(self, size: int) -> None:
        """Room for ranks 0 .. size - 1."""
        grow = size - len(self.best_busy)
        if grow > 0:
            self.best_busy = np.append(self.best_busy, np.full(grow, np.nan))
            self.streak = np.append(self.streak, np.zeros(grow, np.int64))
            self.fast_streak = np.append(self.fast_streak, np.zeros(grow, np.int64))
            self.alarmed = np.append(self.alarmed, np.zeros(grow, bool))


@dataclass
class _Pending:
    """What came so far of one check: whole facts by rank, and the relays' packed rows."""

    ranks: set[int] = field(default_factory=set)
    facts: dict[int, RankFacts] = field(default_factory=dict)
    packed: list[bytes] = field(default_factory=list)
    extras: dict[int, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class CheckOutcome:
    """What one complete check produced: its columns (scored), the alarms, the fleet's loss;
    `ranks`, one `RankRow` per rank, made on demand."""

    attempt: int
    check: int
    step: int
    run_step: int
    columns: CheckColumns
    alarms: list[FleetAlarm]
    loss_mean: float | None

    @property
    def ranks(self) -> list[RankRow]:
        return self.columns.rows()


@dataclass
class FleetAnalyzer:
    """Scores and alarms of one fit's fleet (see the module docstring)."""

    settings: FleetSettings
    world: int  # the ranks of a check when its facts do not say (an elastic fit's say, per attempt)
    compare_digests: bool  # DDP: replicas must agree
    _pending: dict[tuple[int, int], _Pending] = field(default_factory=dict)
    _states: dict[int, _RankStates] = field(default_factory=dict)  # attempt -> its ranks' straggler state
    _offsets: dict[int, int] = field(default_factory=dict)
    _group_names: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    _intros: dict[int, dict[int, Intro]] = field(default_factory=dict)  # attempt -> rank -> its intro (relays)
    _diverged_in: int | None = None  # the attempt of the divergence episode under way (one alarm per attempt)
    _nonfinite_in: int | None = None  # the same for non-finite values
    _held: dict[tuple[int, int], CheckColumns] = field(default_factory=dict)  # complete checks waiting (in order)
    _given_up: set[tuple[int, int]] = field(default_factory=set)  # held checks evaluated without their digests
    groups_on_request: bool = False  # the facts come without group digests: ask for them at a divergence
    dropped_checks: int = 0

    def set_offset(self, attempt: int, offset: int) -> None:
        """The run step at which attempt `attempt` started (rank 0's record says so)."""
        self._offsets[attempt] = offset

    def run_step(self, attempt: int, step: int) -> int:
        """The run step of `step` in attempt `attempt`'s segment."""
        return step + self._offsets.get(attempt, 0)

    def add(self, attempt: int, facts: RankFacts) -> CheckOutcome | None:
        """One rank's whole facts at one check; the check's outcome once every rank's are in."""
        if facts.group_names is not None:
            self._group_names.setdefault(attempt, facts.group_names)
        key = (attempt, facts.check)
        got = self._pending.setdefault(key, _Pending())
        got.facts[facts.rank] = facts
        got.ranks.add(facts.rank)
        return self._if_complete(key, got, facts.world or self.world)

    def add_rows(
        self,
        attempt: int,
        packed: bytes,
        extras: Mapping[int, Mapping[str, Any]],
        intros: Mapping[int, Intro],
        at: tuple[int, list[int]] | None = None,
    ) -> CheckOutcome | None:
        """A node's packed rows at one check (fleet/wire.py: `extras` by rank; `intros`: the ranks
        of these rows seen for the first time this attempt; `at`: their check and ranks, when the
        caller read them already); the check's outcome once every rank's facts are in."""
        known = self._intros.get(attempt)
        if known is None:
            known = self._intros[attempt] = {}
            for old in sorted(self._intros)[:-KEEP_INTRO_ATTEMPTS]:
                del self._intros[old]
        known.update(intros)
        for intro in intros.values():
            if intro.group_names is not None:
                self._group_names.setdefault(attempt, intro.group_names)
        check, ranks = at if at is not None else rows_at(packed)[::2]
        if not ranks:
            return None
        key = (attempt, check)
        got = self._pending.setdefault(key, _Pending())
        got.packed.append(packed)
        got.extras.update(extras)
        got.ranks.update(ranks)
        first = known.get(ranks[0])
        return self._if_complete(key, got, (first.world if first is not None else None) or self.world)

    def _if_complete(self, key: tuple[int, int], got: _Pending, world: int) -> CheckOutcome | None:
        if len(got.ranks) < world:  # the ranks of this attempt
            if len(self._pending) > KEEP_PENDING_CHECKS:
                oldest = min(self._pending)
                del self._pending[oldest]
                self.dropped_checks += 1
            return None
        del self._pending[key]
        attempt, check = key
        columns = self._columns(attempt, got)
        if self.groups_on_request and (
            any(k[0] == attempt for k in self._held) or self._pair_to_locate(attempt, columns)
        ):
            self._held[key] = columns  # after the held one(s) of its attempt, in order
            return None
        return self._evaluate(attempt, check, columns)

    def _columns(self, attempt: int, got: _Pending) -> CheckColumns:
        """A complete check's columns: straight from the packed rows when they are all there is."""
        intros = self._intros.get(attempt, {})
        if not got.facts:
            return CheckColumns.of_rows(b"".join(got.packed), got.extras, intros)
        facts: dict[int, RankFacts] = {}
        for packed in got.packed:  # a check some ranks sent whole (their relay had not started)
            for at in range(0, len(packed), ROW.size):
                rank = ROW.unpack_from(packed, at)[0]
                facts[rank] = unpack(packed[at : at + ROW.size], intros.get(rank), got.extras.get(rank))
        facts.update(got.facts)
        return CheckColumns.of_facts([facts[r] for r in sorted(facts)])

    # ------------------------------------------------------------------ group digests on request
    def wanted_groups(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """(attempt, check, ranks) of each held check whose divergence waits for these ranks'
        parameter-group digests (`groups_on_request`: the facts came without them)."""
        wanted = []
        for (attempt, check), columns in self._held.items():
            pair = self._pair_to_locate(attempt, columns) if self._first_held(attempt) == check else None
            missing = tuple(r for r in pair or () if not columns.groups.get(r))
            if missing:
                wanted.append((attempt, check, missing))
        return wanted

    def add_groups(self, attempt: int, check: int, groups: dict[int, tuple[str, ...]]) -> list[CheckOutcome]:
        """Parameter-group digests of ranks at a held check: the checks of `attempt` that can be
        evaluated now, in order (the held one once the digests that locate it are in)."""
        columns = self._held.get((attempt, check))
        if columns is not None:
            known = set(columns.rank.tolist())
            columns.groups.update({r: tuple(g) for r, g in groups.items() if r in known})
        return self._release(attempt)

    def release(self, attempt: int, check: int | None = None) -> list[CheckOutcome]:
        """The held checks of `attempt` up to `check` (all when None) evaluated without the
        digests that did not come (the divergence alarmed, not located), and those after them
        that need none, in order."""
        for key in self._held:
            if key[0] == attempt and (check is None or key[1] <= check):
                self._given_up.add(key)
        return self._release(attempt)

    def held(self) -> list[tuple[int, int]]:
        """(attempt, check) of every held check."""
        return list(self._held)

    def _release(self, attempt: int) -> list[CheckOutcome]:
        out = []
        while (check := self._first_held(attempt)) is not None:
            key = (attempt, check)
            columns = self._held[key]
            pair = self._pair_to_locate(attempt, columns)
            if key not in self._given_up and pair is not None and not all(columns.groups.get(r) for r in pair):
                break
            del self._held[key]
            self._given_up.discard(key)
            out.append(self._evaluate(attempt, check, columns))
        return out

    def _first_held(self, attempt: int) -> int | None:
        return min((c for a, c in self._held if a == attempt), default=None)

    def _pair_to_locate(self, attempt: int, columns: CheckColumns) -> tuple[int, int] | None:
        """The two ranks (one of the majority, one of the others) whose parameter-group digests
        locate this check's divergence, when it raises a new alarm and one of them lacks them."""
        if not self.compare_digests or self._diverged_in == attempt:
            return None
        split = columns.split()
        if split is None:
            return None
        pair = split[2]
        return pair if not (columns.groups.get(pair[0]) and columns.groups.get(pair[1])) else None

    # ------------------------------------------------------------------ one complete check
    def _evaluate(self, attempt: int, check: int, columns: CheckColumns) -> CheckOutcome:
        step = int(columns.step[0])
        run_step = self.run_step(attempt, step)
        alarms: list[FleetAlarm] = []
        where = {"attempt": attempt, "check": check, "step": step, "run_step": run_step}
        if check > 0:
            alarms += self._stragglers(attempt, columns, where)
        if self.compare_digests:
            alarms += self._divergence(attempt, columns, where)
        alarms += self._nonfinite_alarm(columns, where)
        return CheckOutcome(
            attempt=attempt,
            check=check,
            step=step,
            run_step=run_step,
            columns=columns,
            alarms=alarms,
            loss_mean=columns.loss_mean(),
        )

    def _stragglers(self, attempt: int, c: CheckColumns, where: dict[str, Any]) -> list[FleetAlarm]:
        """The straggler scores of every timed rank, at once (numpy), and the alarms of the ranks
        whose episode starts or ends at this check."""
        timed = ~(np.isnan(c.data_s) & np.isnan(c.forward_s))
        if int(timed.sum()) < 2:
            return []
        data = np.nan_to_num(c.data_s[timed], nan=0.0)
        forward = np.nan_to_num(c.forward_s[timed], nan=0.0)
        busy = data + forward
        walls = c.wall_s[~np.isnan(c.wall_s)]
        wall_median = float(np.median(walls)) if len(walls) else 0.0
        others = _medians_without(np.sort(busy), busy)
        positive = busy > 0
        relative = np.where(positive, np.minimum(1.0, others / np.where(positive, busy, 1.0)), 1.0)
        states = self._states.setdefault(attempt, _RankStates())
        at = c.rank[timed]
        states.fit(int(at.max()) + 1)
        best = np.fmin(states.best_busy[at], busy)
        states.best_busy[at] = best
        individual = np.where(positive, np.minimum(1.0, best / np.where(positive, busy, 1.0)), 1.0)
        slow = (relative < self.settings.slow_score) & (busy - others >= self.settings.min_excess * wall_median)
        data_excess = data - _medians_without(np.sort(data), data)
        forward_excess = forward - _medians_without(np.sort(forward), forward)
        in_data = data_excess >= forward_excess
        streak = np.where(slow, states.streak[at] + 1, 0)
        fast = np.where(slow, 0, states.fast_streak[at] + 1)
        states.streak[at], states.fast_streak[at] = streak, fast
        was_alarmed = states.alarmed[at]
        n = self.settings.slow_checks
        raised = slow & (streak == n) & ~was_alarmed
        recovered = ~raised & was_alarmed & (fast == n)  # the same N both ways: one noisy check decides nothing
        states.alarmed[at[raised]] = True
        states.alarmed[at[recovered]] = False
        size = len(c)
        c.relative, c.individual = np.full(size, np.nan), np.full(size, np.nan)
        c.slow, c.slow_in_data = np.zeros(size, bool), np.zeros(size, bool)
        c.relative[timed], c.individual[timed], c.slow[timed], c.slow_in_data[timed] = (
            relative,
            individual,
            slow,
            in_data,
        )
        alarms: list[FleetAlarm] = []
        for i in np.flatnonzero(raised | recovered).tolist():
            rank, row = int(at[i]), int(np.flatnonzero(timed)[i])
            node, score = c.nodes[row], float(relative[i])
            if raised[i]:
                slow_in = "data" if in_data[i] else "compute"
                component = c.data_s[row] if slow_in == "data" else c.forward_s[row]
                component_s = None if np.isnan(component) else float(component)
                reference = _median_without(
                    sorted((data if slow_in == "data" else forward).tolist()), component_s or 0.0
                )
                what = "data loading" if slow_in == "data" else "compute (forward pass)"
                alarms.append(
                    FleetAlarm(
                        **where,
                        kind="straggler",
                        ranks=(rank,),
                        node=node,
                        slow_in=slow_in,
                        relative_score=round(score, 4),
                        individual_score=round(float(individual[i]), 4),
                        message=f"rank {rank} on node {node} is slow in {what} for {n} checks: "
                        f"{_ms(component_s)} against the other ranks' {_ms(reference)} (straggler score {score:.2f})",
                    )
                )
            else:
                alarms.append(
                    FleetAlarm(
                        **where,
                        kind="straggler_recovered",
                        ranks=(rank,),
                        node=node,
                        message=f"rank {rank} on node {node} is no longer slow for {n} checks "
                        f"(straggler score {score:.2f})",
                    )
                )
        return alarms

    def _divergence(self, attempt: int, c: CheckColumns, where: dict[str, Any]) -> list[FleetAlarm]:
        split = c.split()
        if split is None:
            if self._diverged_in is not None:
                self._diverged_in = None
                return [FleetAlarm(**where, kind="divergence_resolved", message="the replicas' parameters agree again")]
            return []
        if self._diverged_in == attempt:
            return []
        self._diverged_in = attempt  # a new attempt that diverges again is alarmed again
        _, odd, (majority, other) = split
        a, b = c.groups.get(majority, ()), c.groups.get(other, ())
        located = bool(a and b) or not self.groups_on_request
        layer = self._first_difference(attempt, a, b) if located else None
        nodes = sorted({str(c.nodes[c.index(r)]) for r in odd})
        at = f", first in {layer}" if layer else ("" if located else " (not located: the group digests did not come)")
        return [
            FleetAlarm(
                **where,
                kind="divergence",
                ranks=tuple(odd),
                node=",".join(nodes),
                layer=layer,
                message=f"rank(s) {odd} hold parameters that differ from the other replicas' at step "
                f"{where['run_step']}{at}: DDP keeps replicas identical, so something changed them "
                f"outside the all-reduced update (a per-rank edit, a missed broadcast, nondeterminism)",
            )
        ]

    def _first_difference(self, attempt: int, a: tuple[str, ...], b: tuple[str, ...]) -> str | None:
        names = self._group_names.get(attempt)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                if names is None or i >= len(names):
                    return f"parameter group {i}"
                first, last = names[i]
                return _layer(first) if first == last else f"one of {first} ... {last}"
        return None

    def _nonfinite_alarm(self, c: CheckColumns, where: dict[str, Any]) -> list[FleetAlarm]:
        by_loss = c.rank[c.nonfinite_loss].tolist()
        culprits = by_loss or sorted(c.layers)
        if not culprits:
            self._nonfinite_in = None
            return []
        if self._nonfinite_in == where["attempt"]:
            return []
        self._nonfinite_in = where["attempt"]  # a new attempt with the fault back is alarmed again
        layers = list(next((c.layers[r] for r in culprits if c.layers.get(r)), ()))
        source = "loss" if by_loss else "gradients"
        nodes = sorted({str(c.nodes[c.index(r)]) for r in culprits})
        detail = f"; non-finite gradients in {', '.join(layers)}" if layers else ""
        everyone = " (every rank)" if len(culprits) == len(c) and len(c) > 1 else ""
        return [
            FleetAlarm(
                **where,
                kind="nonfinite",
                ranks=tuple(culprits),
                node=",".join(nodes),
                source=source,
                layer=layers[0] if layers else None,
                layers=tuple(layers),
                message=f"non-finite {source} on rank(s) {culprits}{everyone} at step {where['run_step']}{detail}",
            )
        ]


def hang_alarm(attempt: int, error: str, ranks: list[int]) -> FleetAlarm:
    """A fleet alarm for Ray Train's NCCL hang detector (an `NCCLHangError`)."""
    return FleetAlarm(
        attempt=attempt,
        kind="nccl_hang",
        ranks=tuple(ranks),
        message=f"Ray Train's NCCL hang detector stopped the worker group: {error}"[:2000],
        time=time.time(),
    )


def unreadable_alarm(attempt: int, rank: int, check: int, error: str) -> FleetAlarm:
    """A fleet alarm for a rank whose facts could not be read: the checks it misses stay incomplete,
    so fleet health cannot compare the ranks while it lasts."""
    return FleetAlarm(
        attempt=attempt,
        check=check,
        kind="unreadable",
        ranks=(rank,),
        message=f"rank {rank} could not read its fleet facts at check {check} ({error}); fleet health cannot "
        f"compare the ranks at the checks it misses"[:2000],
        time=time.time(),
    )


def _median_without(sorted_values: list[float], value: float) -> float:
    """The median of `sorted_values` with one occurrence of `value` left out, in O(log n)."""
    n = len(sorted_values)
    if n <= 1:
        return value
    p = bisect.bisect_left(sorted_values, value)

    def rest(i: int) -> float:  # element i of the list without position p
        return sorted_values[i] if i < p else sorted_values[i + 1]

    m = n - 1
    return rest(m // 2) if m % 2 else (rest(m // 2 - 1) + rest(m // 2)) / 2


def _medians_without(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`_median_without(sorted_values, v)` for every v of `values` (each one of `sorted_values`), at once."""
    n = len(sorted_values)
    if n <= 1:
        return values.astype(float)
    p = np.searchsorted(sorted_values, values, side="left")

    def rest(i: int) -> np.ndarray:  # element i of the list without position p, for each p
        return np.where(i < p, sorted_values[i], sorted_values[i + 1])

    m = n - 1
    return rest(m // 2) if m % 2 else (rest(m // 2 - 1) + rest(m // 2)) / 2


def _layer(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else param


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"
