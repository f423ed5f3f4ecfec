"""The head node's cost of fleet health against the number of ranks, by simulation (no training).

    python bench/components/fleet_scale.py [--ranks 1 2 8 64 256 1000] [--checks 50]

Feeds the head's fleet view (`FleetHead`: analysis, fleet record on local disk, MLflow entries)
with facts shaped exactly like the ones ranks send (fleet_probe.py: timings, loss, digest, 64
group digests), one rank slow in data loading, and prints per world size: the bytes the ranks send
per check (pickled facts), the fleet record's bytes per check (the whole fit's fleet folder once
the fit has ended, over the checks), and the head's median time per
check, in total and per rank. Ray's metrics export is left out (it needs a Ray cluster; the
real runs in bench/overhead.py --paired include it).
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import tempfile
import time
from pathlib import Path

from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
from ray_ormas._internal.record.store import RecordStore


def rank_facts(rank: int, check: int, rng: random.Random, slow: bool) -> RankFacts:
    digest = f"{check:016x}"
    data = 0.030 if slow else 0.001 + rng.random() * 0.0005
    return RankFacts(
        rank=rank,
        node=f"10.0.{rank // 8 // 256}.{rank // 8 % 256}",
        check=check,
        step=check * 50,
        data_s=data,
        forward_s=0.020 + rng.random() * 0.002,
        wall_s=0.1,
        forwards=1,
        loss=2.0 + rng.random(),
        digest=digest,
        groups=(digest[:8],) * 64,
    )


def simulate(world: int, checks: int) -> dict[str, float]:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore.at(tmp)
        head = FleetHead(FleetSpec(FleetSettings(ray_metrics=False), store, "sim", "sim", world, "ddp"))
        per_check, sent = [], []
        for check in range(checks):
            facts = [
                rank_facts(r, check, rng, slow=(r == world - 1 and world > 1 and check >= 5)) for r in range(world)
            ]
            sent.append(sum(len(pickle.dumps(f)) for f in facts))
            started = time.perf_counter()
            for f in facts:
                head.facts(0, f)
            per_check.append(time.perf_counter() - started)
        summary = head.finish()
        written = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
    ms = statistics.median(per_check) * 1000
    return {
        "world": world,
        "sent_kb": statistics.median(sent) / 1024,
        "record_kb": written / checks / 1024,
        "head_ms": ms,
        "head_us_per_rank": ms * 1000 / world,
        "alarms": len([a for a in summary.alarms if a["kind"] == "straggler"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8, 64, 256, 1000])
    p.add_argument("--checks", type=int, default=50)
    args = p.parse_args()
    print(
        f"{'ranks':>6} {'sent KB/check':>13} {'record KB/check':>15} {'head ms/check':>13} "
        f"{'head us/rank':>12} {'straggler alarms':>16}"
    )
    for world in args.ranks:
        r = simulate(world, args.checks)
        print(
            f"{r['world']:>6} {r['sent_kb']:>13.1f} {r['record_kb']:>15.1f} {r['head_ms']:>13.3f} "
            f"{r['head_us_per_rank']:>12.1f} {r['alarms']:>16}",
            flush=True,
        )


if __name__ == "__main__":
    main()
