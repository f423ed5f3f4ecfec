"""A long run's fleet record and the head's memory, by simulation (no training, no Ray).

    python bench/components/fleet_week.py [--ranks 1000] [--checks 100000] [--out DIR]

Feeds the head's fleet view (`FleetHead`: analysis, the Parquet fleet record on local disk) with
`--checks` checks of `--ranks` ranks, facts shaped as the ranks send them (as
bench/components/fleet_scale.py), with a straggler episode every 5,000 checks (one rank slow in
data loading for 20 checks: an alarm and its recovery). It prints, as it goes, the head process's
resident memory (RSS) and the record's size; at the end the memory growth after the first tenth
of the checks (at least 1,000: the warm-up of imports, the first parts and merges, the
allocators' pools), the record's bytes per check and its files, then
how long the readers take on it: `open_records(...).fleet_checks()` and `.fleet_summaries()`, the
fleet part of `ray-ormas report` and run.html. At a check every 10 s, 60,480 checks are a week.
"""

from __future__ import annotations

import argparse
import io
import random
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

from ray_ormas._internal.cli.main import _fleet_report
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.driver.run_page import build_run_page
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.store import RecordStore

EPISODE_EVERY = 5000
EPISODE_CHECKS = 20


def rss_mb() -> float:
    """This process's resident memory now (Linux /proc), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def folder_bytes(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def simulate(world: int, checks: int, root: Path) -> None:
    store = RecordStore.at(str(root))
    head = FleetHead(FleetSpec(FleetSettings(ray_metrics=False), store, "week", "week", world, "ddp"))
    rng = random.Random(0)
    jitter = [rng.random() * 0.0005 for _ in range(4096)]
    baseline = None
    warm = max(1000, checks // 10)  # imports, the first parts and merges, the allocators' pools
    started = time.perf_counter()
    for check in range(checks):
        episode = check % EPISODE_EVERY
        slow_rank = (check // EPISODE_EVERY) % world if 0 < episode <= EPISODE_CHECKS else -1
        digest = f"{check:016x}"
        for r in range(world):
            j = jitter[(check * 7 + r) % len(jitter)]
            head.facts(
                0,
                RankFacts(
                    rank=r,
                    node=f"10.0.{r // 8 // 256}.{r // 8 % 256}",
                    check=check,
                    step=check * 50,
                    data_s=0.030 if r == slow_rank else 0.001 + j,
                    forward_s=0.020 + j,
                    wall_s=0.1,
                    timed_steps=8,
                    forwards=8,
                    loss=2.0 + j,
                    digest=digest,
                ),
            )
        if check + 1 == warm:
            baseline = rss_mb()
        if (check + 1) % max(1, checks // 20) == 0 or check + 1 == checks:
            size, files = folder_bytes(root)
            print(
                f"check {check + 1:>7}: RSS {rss_mb():7.1f} MB, record {size / 1e6:8.2f} MB in {files} files, "
                f"{(time.perf_counter() - started) / (check + 1) * 1000:.2f} ms/check",
                flush=True,
            )
    end_rss = rss_mb()
    summary = head.finish()
    size, files = folder_bytes(root)
    alarms = [a["kind"] for a in summary.alarms]
    print(
        f"\n{world} ranks, {checks} checks: memory {baseline if baseline is not None else float('nan'):.1f} MB at "
        f"check {warm:,} -> {end_rss:.1f} MB at the end (+{end_rss - (baseline or end_rss):.1f} MB); record "
        f"{size / 1e6:.2f} MB, {size / checks / 1024:.2f} KB per check, {files} files; "
        f"{alarms.count('straggler')} straggler alarms, {alarms.count('straggler_recovered')} recoveries"
    )
    records = RunRecords(store)
    for name, read in (
        ("open_records(...).fleet_checks()", lambda: records.fleet_checks().num_rows),
        ("open_records(...).fleet_summaries()", lambda: records.fleet_summaries().num_rows),
        ("ray-ormas report (its fleet part)", lambda: _quiet(_fleet_report, records)),
        ("run.html", lambda: len(build_run_page(records))),
    ):
        t = time.perf_counter()
        got = read()
        print(f"  {name:<38} {time.perf_counter() - t:7.2f} s  ({got})", flush=True)


def _quiet(report, records) -> int:
    out = io.StringIO()
    with redirect_stdout(out):
        report(records)
    return len(out.getvalue().splitlines())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1000)
    p.add_argument("--checks", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=None, help="keep the record here (default: a temporary folder)")
    args = p.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        simulate(args.ranks, args.checks, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        simulate(args.ranks, args.checks, Path(tmp))


if __name__ == "__main__":
    main()
