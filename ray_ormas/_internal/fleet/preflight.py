"""The pre-flight screen's verdict: every rank's probe results compared with its peers'.

Pure Python, no Ray, no torch: the run ledger (head/ledger.py) gathers one `ProbeResult` per
rank (measured by worker/preflight.py) and asks `judge` for the verdict; the fleet head writes it
(head/fleet_head.py) and the fleet's actions act on its alarm (head/fleet_actions.py).

The rules (docs/fleet-health.md, "Before the first step"):

* a rank is compared with the ranks on *other* nodes: its matmul time and its link time (the
  fastest of its timed runs and pair exchanges) against their median. More than `factor` times the median
  is slow. With one rank, or every rank on one node, there is nothing to compare against, and
  the verdict says so;
* a floor is absolute: a matmul slower than `min_flops`, an all-reduce below `min_bytes_per_s`;
* a probe that raised, timed out or computed a wrong result is broken, whatever its peers did;
* one `preflight` alarm names every slow or broken rank, with its node and its numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ray_ormas._internal.common.fleet_records import FleetAlarm
from ray_ormas._internal.common.preflight_settings import PreflightSettings


@dataclass(frozen=True)
class ProbeResult:
    """What one rank measured before the first step.

    Attributes:
        rank, node, node_id: the rank and where it runs (the node's address and Ray's hex id).
        device: "cpu" or "cuda:N".
        compute_s: the fastest of its timed matmuls, in seconds (None: not measured, it failed).
        flops: the matmul's FLOP/s at that time.
        link_s: the fastest of its timed exchanges with its partner ranks (None: no partner).
        allreduce_s: the median seconds of the group's all-reduce.
        bytes_per_s: the all-reduce's bus bandwidth (bytes each rank moves per second).
        facts: what the user's probes returned, by probe.
        broken: why a probe failed, by probe ("compute", "allreduce", "exchange", a user probe).
        seconds: the whole screen on this rank, its wait for the verdict excluded.
    """

    rank: int
    node: str | None = None
    node_id: str | None = None
    device: str = "cpu"
    compute_s: float | None = None
    flops: float | None = None
    link_s: float | None = None
    allreduce_s: float | None = None
    bytes_per_s: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The screen of one attempt: every rank's row, the alarm (None: clean) and a note when there
    was nothing to compare against."""

    attempt: int
    rows: list[dict[str, Any]]
    alarm: FleetAlarm | None
    note: str | None
    seconds: float | None  # the slowest rank's screen

    def summary(self) -> dict[str, Any]:
        """The attempt's screen as `result.ormas.fleet.preflight` and the report list it."""
        return {
            "attempt": self.attempt,
            "ranks": len(self.rows),
            "seconds": self.seconds,
            "clean": self.alarm is None,
            "named": sorted(r["rank"] for r in self.rows if r["slow"] or r["broken"]),
            "note": self.note,
            "message": self.alarm.message if self.alarm is not None else None,
        }


def judge(attempt: int, results: list[ProbeResult], settings: PreflightSettings, missing: list[int]) -> Verdict:
    """The verdict on `attempt` from its ranks' `results` (`missing`: ranks that never sent theirs)."""
    results = sorted(results, key=lambda r: r.rank)
    nodes = {r.node_id or r.node for r in results}
    note = None
    if len(results) + len(missing) == 1:
        note = "one rank: nothing to compare against"
    elif len(nodes) == 1 and not missing:
        note = "every rank runs on one node: nothing to compare against"
    rows: list[dict[str, Any]] = []
    for r in results:
        peers = [p for p in results if (p.node_id or p.node) != (r.node_id or r.node)]
        reasons: list[str] = []
        compute_peers = _median([p.compute_s for p in peers])
        link_peers = _median([p.link_s for p in peers])
        if _slower(r.compute_s, compute_peers, settings.factor):
            reasons.append(f"its matmul took {_ms(r.compute_s)}, the median on other nodes {_ms(compute_peers)}")
        if _slower(r.link_s, link_peers, settings.factor):
            reasons.append(f"its exchange took {_ms(r.link_s)}, the median on other nodes {_ms(link_peers)}")
        if _below(r.flops, settings.min_flops):
            floor = _g(settings.min_flops, 1e9)
            reasons.append(f"its matmul ran at {_g(r.flops, 1e9)} GFLOP/s, below the floor of {floor}")
        if _below(r.bytes_per_s, settings.min_bytes_per_s):
            floor = _g(settings.min_bytes_per_s, 1e6)
            reasons.append(f"the all-reduce moved {_g(r.bytes_per_s, 1e6)} MB/s, below the floor of {floor}")
        rows.append(
            {
                "attempt": attempt,
                "rank": r.rank,
                "node": r.node,
                "node_id": r.node_id,
                "device": r.device,
                "compute_s": r.compute_s,
                "flops": r.flops,
                "compute_peers_s": compute_peers,
                "link_s": r.link_s,
                "link_peers_s": link_peers,
                "allreduce_s": r.allreduce_s,
                "bytes_per_s": r.bytes_per_s,
                "facts": dict(r.facts),
                "broken": dict(r.broken),
                "slow": bool(reasons),
                "why": "; ".join(reasons) or None,
                "seconds": r.seconds,
            }
        )
    for rank in missing:
        why = f"no result within the screen's timeout_s ({settings.timeout_s:g} s)"
        rows.append({"attempt": attempt, "rank": rank, "broken": {"screen": why}, "slow": False, "why": None})
    rows.sort(key=lambda x: int(x["rank"]))
    seconds = max((r.seconds for r in results if r.seconds is not None), default=None)
    return Verdict(attempt, rows, _alarm(attempt, rows), note, seconds)


def _alarm(attempt: int, rows: list[dict[str, Any]]) -> FleetAlarm | None:
    named = [r for r in rows if r["slow"] or r["broken"]]
    if not named:
        return None
    said = []
    for r in named:
        what = [f"{probe} is broken ({why})" for probe, why in r["broken"].items()]
        what += [r["why"]] if r["why"] else []
        said.append(f"rank {r['rank']} on node {_where(r)}: {'; '.join(what)}")
    return FleetAlarm(
        kind="preflight",
        message=f"the screen of attempt {attempt}: " + ". ".join(said),
        attempt=attempt,
        run_step=None,
        ranks=tuple(r["rank"] for r in named),
        node=",".join(dict.fromkeys(_where(r) for r in named)),
    )


def _where(row: dict[str, Any]) -> str:
    """A rank's node as the alarm names it: its address, and Ray's id when it has one."""
    node, node_id = row.get("node") or "?", row.get("node_id")
    return f"{node} ({node_id[:8]})" if node_id else node


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _slower(value: float | None, peers: float | None, factor: float) -> bool:
    return value is not None and peers is not None and peers > 0 and value > factor * peers


def _below(value: float | None, floor: float | None) -> bool:
    return value is not None and floor is not None and value < floor


def _g(value: float | None, unit: float) -> str:
    return "-" if value is None else f"{value / unit:.3g}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.3g} ms"
