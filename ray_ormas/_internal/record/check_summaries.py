"""A complete check in a few hundred bytes, whatever the number of ranks, and which checks keep
every rank's row.

Pure Python, no Ray, no torch. The head (head/fleet_head.py) makes each complete check's summary
from its columns (fleet/check_columns.py, the same row as `check_summary`'s), and Ray's metrics
(head/fleet_metrics.py) share its quantiles; `check_summary` makes it from a check's lines (a
version-1 record, read back).

* `check_summary`: one row per check for the fleet record's `summaries` table: the number of
  ranks, the fleet's and rank 0's loss, the quantiles (min, p10, p50, p90, max) of every timing
  and score, the slow ranks, the worst rank, the ranks with non-finite values, the digest groups
  (how many distinct parameter digests, and the ranks outside the largest group).
* `RowSampler`: which checks keep every rank's row in the `checks` table. Up to
  `FleetSettings.record_ranks` ranks, every check (a small fit's record reads as it always did).
  Above, every `record_rows_every`-th check of an attempt, the attempt's first check, each check
  with an alarm and the `AROUND_ALARM` checks before and after it (the ones before are held back
  until then): the evidence for the moments that matter, and little the rest of the time. A rank
  that stays slow after its alarm is in every summary (`slow_ranks`, `worst_rank`), not in
  every row.

Hooks relied on: none.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

SUMMARISED = ("relative_score", "individual_score", "data_s", "forward_s", "wall_s", "loss")
QUANTILES = (("min", 0.0), ("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))
AROUND_ALARM = 2  # checks before and after a check with an alarm that keep every rank's row
WHERE = ("attempt", "check", "step", "run_step", "time")
SHOWN_RANKS = 16  # at most this many ranks named in a summary's lists (their number is always there)


def quantiles(values: list[float]) -> list[tuple[str, float]]:
    """(name, value) of QUANTILES over `values` (nearest rank), empty when there are none."""
    found = sorted(values)
    return [(q, found[round(at * (len(found) - 1))]) for q, at in QUANTILES] if found else []


def number(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a bool). Called for every rank's values at
    every check: a plain float or int is told first, cheaply."""
    kind = type(value)
    if kind is float or kind is int:
        return math.isfinite(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of one complete check (`lines`: its `checks` lines, one per rank; the
    `RowSampler` adds `full_rows`)."""
    first = lines[0]
    out: dict[str, Any] = {k: first.get(k) for k in WHERE}
    out["ranks"] = len(lines)
    losses = [float(x["loss"]) for x in lines if number(x.get("loss"))]
    out["loss_mean"] = statistics.fmean(losses) if losses else None
    rank0 = next((x for x in lines if x.get("rank") == 0), None)
    out["loss_rank0"] = rank0.get("loss") if rank0 is not None and isinstance(rank0.get("loss"), float) else None
    for value in SUMMARISED:
        got = dict(quantiles([float(x[value]) for x in lines if number(x.get(value))]))
        for q, _ in QUANTILES:
            out[f"{value}_{q}"] = got.get(q)
    slow = sorted(int(x["rank"]) for x in lines if x.get("slow"))
    out["slow_count"] = len(slow)
    out["slow_ranks"] = slow[:SHOWN_RANKS]
    scored = [x for x in lines if number(x.get("relative_score"))]
    worst = min(scored, key=lambda x: (x["relative_score"], x["rank"])) if scored else None
    out["worst_rank"] = int(worst["rank"]) if worst is not None else None
    out["worst_node"] = worst.get("node") if worst is not None else None
    nonfinite = sorted(int(x["rank"]) for x in lines if x.get("nonfinite"))
    out["nonfinite_count"] = len(nonfinite)
    out["nonfinite_ranks"] = nonfinite[:SHOWN_RANKS]
    groups: dict[Any, list[int]] = {}
    for x in lines:
        groups.setdefault(x.get("digest"), []).append(int(x["rank"]))
    majority = max(groups.values(), key=lambda ranks: (len(ranks), 0 in ranks)) if groups else []
    odd = sorted(r for ranks in groups.values() if ranks is not majority for r in ranks)
    out["digest_groups"] = len([d for d in groups if d is not None])
    out["odd_count"] = len(odd)
    out["odd_ranks"] = odd[:SHOWN_RANKS]
    return out


Lines = Callable[[], list[dict[str, Any]]]  # a check's rows, made when asked


@dataclass
class RowSampler:
    """Which checks keep every rank's row (see the module docstring). Not thread-safe: the head
    calls it under its lock, one check at a time. A check's rows are made (`lines()`) only when
    they are kept."""

    record_ranks: int
    every: int
    _held: deque[tuple[dict[str, Any], Lines]] = field(default_factory=deque)
    _after: int = 0  # checks after an alarm still to keep

    def take(
        self, check: int | None, ranks: int, lines: Lines, summary: dict[str, Any], alarmed: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """This check's summary and rows (`check` None: alarms between checks, a hang): (the
        summaries, the rows) the record writes now. A check held back (in case an alarm follows)
        is written when it is kept or let go; its summary's `full_rows` says which."""
        if check is None:  # an alarm between checks (a hang): keep what is held and the next checks
            if not alarmed:
                return [], []
            self._after = AROUND_ALARM
            kept = list(self._held)
            self._held.clear()
            return [{**s, "full_rows": True} for s, _ in kept], [row for _, rows in kept for row in rows()]
        if ranks <= self.record_ranks:
            return self._release() + [{**summary, "full_rows": True}], lines()
        if alarmed:
            self._after = AROUND_ALARM
            kept = list(self._held)
            self._held.clear()
            summaries = [{**s, "full_rows": True} for s, _ in kept] + [{**summary, "full_rows": True}]
            return summaries, [row for _, rows in kept for row in rows()] + lines()
        keep = check == 0 or check % max(1, self.every) == 0 or self._after > 0
        self._after = max(0, self._after - 1)
        if keep:
            return self._release() + [{**summary, "full_rows": True}], lines()
        self._held.append((summary, lines))
        return (self._release(keep_last=AROUND_ALARM), [])

    def _release(self, keep_last: int = 0) -> list[dict[str, Any]]:
        """The summaries of the held checks beyond the last `keep_last`, their rows let go."""
        out = []
        while len(self._held) > keep_last:
            summary, _ = self._held.popleft()
            out.append({**summary, "full_rows": False})
        return out

    def flush(self) -> list[dict[str, Any]]:
        """The fit ended: the summaries of the checks still held back (their rows let go)."""
        return self._release()
