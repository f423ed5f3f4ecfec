"""The head node's view of the fleet: every rank's facts at a check turned into scores and alarms.

Pure Python, no Ray, no torch: the run ledger (head/ledger.py) feeds it the facts each rank sends at
each check (worker/fleet_probe.py) and writes what it returns to the fleet record, MLflow and Ray's
metrics. bench/components/fleet_scale.py feeds it simulated facts for up to 1,000 ranks.

Per check, once every rank's facts are in (work and output linear in the number of ranks):

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

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ray_ormas._internal.common.fleet_records import FleetAlarm, RankRow
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.fleet.facts import RankFacts

KEEP_PENDING_CHECKS = 8  # checks waiting for missing ranks are dropped beyond this many


@dataclass
class _RankState:
    best_busy: float | None = None
    streak: int = 0  # slow checks in a row
    fast_streak: int = 0  # checks in a row that were not slow
    alarmed: bool = False


@dataclass
class CheckOutcome:
    """What one complete check produced: one row per rank, the alarms, the fleet's loss."""

    attempt: int
    check: int
    step: int
    run_step: int
    ranks: list[RankRow]
    alarms: list[FleetAlarm]
    loss_mean: float | None


@dataclass
class FleetAnalyzer:
    """Scores and alarms of one fit's fleet (see the module docstring)."""

    settings: FleetSettings
    world: int  # the ranks of a check when its facts do not say (an elastic fit's say, per attempt)
    compare_digests: bool  # DDP: replicas must agree
    _pending: dict[tuple[int, int], dict[int, RankFacts]] = field(default_factory=dict)
    _ranks: dict[tuple[int, int], _RankState] = field(default_factory=dict)
    _offsets: dict[int, int] = field(default_factory=dict)
    _group_names: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    _diverged_in: int | None = None  # the attempt of the divergence episode under way (one alarm per attempt)
    _nonfinite_in: int | None = None  # the same for non-finite values
    _held: dict[tuple[int, int], _Held] = field(default_factory=dict)  # complete checks waiting (in order)
    groups_on_request: bool = False  # the facts come without group digests: ask for them at a divergence
    dropped_checks: int = 0

    def set_offset(self, attempt: int, offset: int) -> None:
        """The run step at which attempt `attempt` started (rank 0's record says so)."""
        self._offsets[attempt] = offset

    def run_step(self, attempt: int, step: int) -> int:
        """The run step of `step` in attempt `attempt`'s segment."""
        return step + self._offsets.get(attempt, 0)

    def add(self, attempt: int, facts: RankFacts) -> CheckOutcome | None:
        """One rank's facts at one check; the check's outcome once every rank's are in."""
        if facts.group_names is not None:
            self._group_names.setdefault(attempt, facts.group_names)
        key = (attempt, facts.check)
        got = self._pending.setdefault(key, {})
        got[facts.rank] = facts
        if len(got) < (facts.world or self.world):  # the ranks of this attempt
            if len(self._pending) > KEEP_PENDING_CHECKS:
                oldest = min(self._pending)
                del self._pending[oldest]
                self.dropped_checks += 1
            return None
        del self._pending[key]
        complete = [got[r] for r in sorted(got)]
        if self.groups_on_request and (
            any(k[0] == attempt for k in self._held) or self._pair_to_locate(attempt, complete)
        ):
            self._held[key] = _Held(complete)  # after the held one(s) of its attempt, in order
            return None
        return self._evaluate(attempt, key[1], complete)

    # ------------------------------------------------------------------ group digests on request
    def wanted_groups(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """(attempt, check, ranks) of each held check whose divergence waits for these ranks'
        parameter-group digests (`groups_on_request`: the facts came without them)."""
        wanted = []
        for (attempt, check), held in self._held.items():
            pair = self._pair_to_locate(attempt, held.facts) if self._first_held(attempt) == check else None
            missing = tuple(r for r in pair or () if not held.by_rank[r].groups)
            if missing:
                wanted.append((attempt, check, missing))
        return wanted

    def add_groups(self, attempt: int, check: int, groups: dict[int, tuple[str, ...]]) -> list[CheckOutcome]:
        """Parameter-group digests of ranks at a held check: the checks of `attempt` that can be
        evaluated now, in order (the held one once the digests that locate it are in)."""
        held = self._held.get((attempt, check))
        if held is not None:
            for rank, g in groups.items():
                if rank in held.by_rank:
                    held.by_rank[rank] = replace(held.by_rank[rank], groups=g)
            held.facts = [held.by_rank[f.rank] for f in held.facts]
        return self._release(attempt)

    def release(self, attempt: int, check: int | None = None) -> list[CheckOutcome]:
        """The held checks of `attempt` up to `check` (all when None) evaluated without the
        digests that did not come (the divergence alarmed, not located), and those after them
        that need none, in order."""
        for key, held in self._held.items():
            if key[0] == attempt and (check is None or key[1] <= check):
                held.given_up = True
        return self._release(attempt)

    def held(self) -> list[tuple[int, int]]:
        """(attempt, check) of every held check."""
        return list(self._held)

    def _release(self, attempt: int) -> list[CheckOutcome]:
        out = []
        while (check := self._first_held(attempt)) is not None:
            held = self._held[(attempt, check)]
            if not held.given_up and self._pair_to_locate(attempt, held.facts) is not None:
                pair = self._pair_to_locate(attempt, held.facts) or ()
                if not all(held.by_rank[r].groups for r in pair):
                    break
            del self._held[(attempt, check)]
            out.append(self._evaluate(attempt, check, held.facts))
        return out

    def _first_held(self, attempt: int) -> int | None:
        return min((c for a, c in self._held if a == attempt), default=None)

    def _pair_to_locate(self, attempt: int, facts: list[RankFacts]) -> tuple[int, int] | None:
        """The two ranks (one of the majority, one of the others) whose parameter-group digests
        locate this check's divergence, when it raises a new alarm and one of them lacks them."""
        if not self.compare_digests or self._diverged_in == attempt:
            return None
        split = _split(facts)
        if split is None:
            return None
        pair = split[2]
        by_rank = {f.rank: f for f in facts}
        return pair if not (by_rank[pair[0]].groups and by_rank[pair[1]].groups) else None

    # ------------------------------------------------------------------ one complete check
    def _evaluate(self, attempt: int, check: int, facts: list[RankFacts]) -> CheckOutcome:
        step = facts[0].step
        run_step = self.run_step(attempt, step)
        rows: list[dict[str, Any]] = [
            {
                "rank": f.rank,
                "node": f.node,
                "data_s": f.data_s,
                "forward_s": f.forward_s,
                "wall_s": f.wall_s,
                "timed_steps": f.timed_steps,
                "loss": f.loss,
                "nonfinite": f.nonfinite_loss or bool(f.nonfinite_layers),
                "digest": f.digest,
                "relative_score": None,
                "individual_score": None,
                "slow": False,
                "slow_in": None,
            }
            for f in facts
        ]
        alarms: list[FleetAlarm] = []
        where = {"attempt": attempt, "check": check, "step": step, "run_step": run_step}
        if check > 0:
            alarms += self._stragglers(attempt, rows, where)
        if self.compare_digests:
            alarms += self._divergence(attempt, facts, where)
        alarms += self._nonfinite_alarm(facts, where)
        losses = [r["loss"] for r in rows if isinstance(r["loss"], float) and _finite(r["loss"])]
        return CheckOutcome(
            attempt=attempt,
            check=check,
            step=step,
            run_step=run_step,
            ranks=[RankRow(**r) for r in rows],
            alarms=alarms,
            loss_mean=statistics.fmean(losses) if losses else None,
        )

    def _stragglers(self, attempt: int, rows: list[dict[str, Any]], where: dict[str, Any]) -> list[FleetAlarm]:
        busy = [_busy(r) for r in rows]
        timed = [b for b in busy if b is not None]
        if len(timed) < 2:
            return []
        walls = [r["wall_s"] for r in rows if isinstance(r["wall_s"], (int, float))]
        wall_median = statistics.median(walls) if walls else 0.0
        sorted_busy = sorted(timed)
        data = sorted(r["data_s"] or 0.0 for r, b in zip(rows, busy) if b is not None)
        forward = sorted(r["forward_s"] or 0.0 for r, b in zip(rows, busy) if b is not None)
        alarms: list[FleetAlarm] = []
        for r, b in zip(rows, busy):
            if b is None:
                continue
            state = self._ranks.setdefault((attempt, r["rank"]), _RankState())
            others = _median_without(sorted_busy, b)
            relative = 1.0 if b <= 0 else min(1.0, others / b)
            state.best_busy = b if state.best_busy is None else min(state.best_busy, b)
            individual = 1.0 if b <= 0 else min(1.0, state.best_busy / b)
            excess = b - others
            slow = relative < self.settings.slow_score and excess >= self.settings.min_excess * wall_median
            data_excess = (r["data_s"] or 0.0) - _median_without(data, r["data_s"] or 0.0)
            forward_excess = (r["forward_s"] or 0.0) - _median_without(forward, r["forward_s"] or 0.0)
            slow_in = "data" if data_excess >= forward_excess else "compute"
            r.update(
                relative_score=round(relative, 4),
                individual_score=round(individual, 4),
                slow=slow,
                slow_in=slow_in if slow else None,
            )
            state.streak = state.streak + 1 if slow else 0
            state.fast_streak = 0 if slow else state.fast_streak + 1
            if slow and state.streak == self.settings.slow_checks and not state.alarmed:
                state.alarmed = True
                what = "data loading" if slow_in == "data" else "compute (forward pass)"
                component = r["data_s"] if slow_in == "data" else r["forward_s"]
                reference = _median_without(data if slow_in == "data" else forward, component or 0.0)
                alarms.append(
                    FleetAlarm(
                        **where,
                        kind="straggler",
                        ranks=(r["rank"],),
                        node=r["node"],
                        slow_in=slow_in,
                        relative_score=r["relative_score"],
                        individual_score=r["individual_score"],
                        message=f"rank {r['rank']} on node {r['node']} is slow in {what} for "
                        f"{state.streak} checks: {_ms(component)} against the other ranks' "
                        f"{_ms(reference)} (straggler score {relative:.2f})",
                    )
                )
            elif state.alarmed and state.fast_streak == self.settings.slow_checks:
                # The same N both ways: one noisy check on a loaded node neither raises nor ends an episode.
                state.alarmed = False
                alarms.append(
                    FleetAlarm(
                        **where,
                        kind="straggler_recovered",
                        ranks=(r["rank"],),
                        node=r["node"],
                        message=f"rank {r['rank']} on node {r['node']} is no longer slow for "
                        f"{state.fast_streak} checks (straggler score {relative:.2f})",
                    )
                )
        return alarms

    def _divergence(self, attempt: int, facts: list[RankFacts], where: dict[str, Any]) -> list[FleetAlarm]:
        split = _split(facts)
        if split is None:
            if self._diverged_in is not None:
                self._diverged_in = None
                return [FleetAlarm(**where, kind="divergence_resolved", message="the replicas' parameters agree again")]
            return []
        if self._diverged_in == attempt:
            return []
        self._diverged_in = attempt  # a new attempt that diverges again is alarmed again
        _, odd, (majority, other) = split
        by_rank = {f.rank: f for f in facts}
        a, b = by_rank[majority].groups, by_rank[other].groups
        located = bool(a and b) or not self.groups_on_request
        layer = self._first_difference(attempt, a, b) if located else None
        nodes = sorted({str(by_rank[r].node) for r in odd})
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

    def _nonfinite_alarm(self, facts: list[RankFacts], where: dict[str, Any]) -> list[FleetAlarm]:
        by_loss = [f for f in facts if f.nonfinite_loss]
        by_grad = [f for f in facts if f.nonfinite_layers]
        culprits = by_loss or by_grad
        if not culprits:
            self._nonfinite_in = None
            return []
        if self._nonfinite_in == where["attempt"]:
            return []
        self._nonfinite_in = where["attempt"]  # a new attempt with the fault back is alarmed again
        ranks = sorted(f.rank for f in culprits)
        layers = list(next((f.nonfinite_layers for f in culprits if f.nonfinite_layers), ()))
        source = "loss" if by_loss else "gradients"
        nodes = sorted({str(f.node) for f in culprits})
        detail = f"; non-finite gradients in {', '.join(layers)}" if layers else ""
        everyone = " (every rank)" if len(ranks) == len(facts) and len(facts) > 1 else ""
        return [
            FleetAlarm(
                **where,
                kind="nonfinite",
                ranks=tuple(ranks),
                node=",".join(nodes),
                source=source,
                layer=layers[0] if layers else None,
                layers=tuple(layers),
                message=f"non-finite {source} on rank(s) {ranks}{everyone} at step {where['run_step']}{detail}",
            )
        ]


@dataclass
class _Held:
    """A complete check held back: its divergence waits for parameter-group digests, or a check
    before it does (checks are evaluated in order)."""

    facts: list[RankFacts]
    by_rank: dict[int, RankFacts] = field(init=False)
    given_up: bool = False  # evaluated without the digests that did not come

    def __post_init__(self) -> None:
        self.by_rank = {f.rank: f for f in self.facts}


def _split(facts: list[RankFacts]) -> tuple[str | None, list[int], tuple[int, int]] | None:
    """(the majority's digest, the other ranks, (a rank of the majority, the first other)) when
    the digests differ; None when they agree. On a tie, rank 0's digest is the majority's."""
    groups: dict[str | None, list[int]] = {}
    for f in facts:
        groups.setdefault(f.digest, []).append(f.rank)
    if len(groups) <= 1:
        return None
    majority = max(groups, key=lambda d: (len(groups[d]), 0 in groups[d]))
    odd = sorted(r for d, ranks in groups.items() if d != majority for r in ranks)
    return majority, odd, (groups[majority][0], odd[0])


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


def _busy(row: dict[str, Any]) -> float | None:
    data, forward = row.get("data_s"), row.get("forward_s")
    if data is None and forward is None:
        return None
    return (data or 0.0) + (forward or 0.0)


def _median_without(sorted_values: list[float], value: float) -> float:
    """The median of `sorted_values` with one occurrence of `value` left out, in O(log n)."""
    import bisect

    n = len(sorted_values)
    if n <= 1:
        return value
    p = bisect.bisect_left(sorted_values, value)

    def rest(i: int) -> float:  # element i of the list without position p
        return sorted_values[i] if i < p else sorted_values[i + 1]

    m = n - 1
    return rest(m // 2) if m % 2 else (rest(m // 2 - 1) + rest(m // 2)) / 2


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def _layer(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else param


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"
