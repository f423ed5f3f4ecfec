"""The fleet record at scale, without Ray: Parquet parts that stay few, a summary row per check,
every rank's row only at the checks that matter above `record_ranks`, records of the JSON-lines
format still read, and MLflow's entries the same whether the live writer or `mlflow-sync` makes
them. The head's fleet view (`FleetHead`) is fed facts shaped as the ranks send them; the fleet
record of real fits is read back in tests/test_fleet.py, test_node_loss.py and test_s3.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

import ray_ormas
from ray_ormas import FleetSettings
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
from ray_ormas._internal.record import fleet_tables
from ray_ormas._internal.record.check_summaries import AROUND_ALARM
from ray_ormas._internal.record.fleet_record import fleet_summary, read_fleet_summaries
from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE, PartsWriter, read_table
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.sync import fleet_entries


def facts(rank: int, check: int, slow: bool, rng: random.Random) -> RankFacts:
    return RankFacts(
        rank=rank,
        node=f"node-{rank // 8}",
        check=check,
        step=check * 10,
        data_s=0.030 if slow else 0.001 + rng.random() * 0.0005,
        forward_s=0.020 + rng.random() * 0.002,
        wall_s=0.1,
        timed_steps=8,
        forwards=8,
        loss=2.0 + rng.random(),
        digest="d" * 16,
    )


class Entries:
    """The head's MLflow side, as the ledger's writer receives it (head/mlflow_link.py `fleet`)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, float, int]] = []

    def fleet(self, entries: list[tuple[str, float, int]]) -> None:
        self.got += entries


def run_head(tmp_path: Path, world: int, checks: int, slow_from: int, **settings) -> tuple[RecordStore, Entries, Any]:
    """A fit's fleet view fed `checks` checks of `world` ranks, the last rank slow in data loading
    from check `slow_from`; the record on local disk."""
    store = RecordStore.at(str(tmp_path / "ormas"))
    entries = Entries()
    settings = {"ray_metrics": False, **settings}
    head = FleetHead(FleetSpec(FleetSettings(**settings), store, "fit", "run", world, "ddp"), tracking=entries)
    rng = random.Random(0)
    for check in range(checks):
        for rank in range(world):
            head.facts(0, facts(rank, check, rank == world - 1 and check >= slow_from, rng))
    return store, entries, head.finish()


def test_up_to_record_ranks_every_rank_s_row_is_kept_at_every_check(tmp_path):
    store, _, summary = run_head(tmp_path, world=8, checks=12, slow_from=4)
    records = RunRecords(RecordStore.at(str(tmp_path / "ormas")))
    rows = records.fleet_checks()
    assert rows.num_rows == 8 * 12 and summary.checks == 12
    summaries = records.fleet_summaries().to_pylist()
    assert [s["check"] for s in summaries] == list(range(12)) and all(s["full_rows"] for s in summaries)
    assert all(s["ranks"] == 8 for s in summaries)
    # The slow rank is in every summary from its first slow check that is scored, and it is the worst.
    slow = [s["check"] for s in summaries if s["slow_ranks"] == [7]]
    assert slow == list(range(4, 12)) and all(s["worst_rank"] == 7 for s in summaries[4:])
    assert summaries[5]["data_s_max"] == pytest.approx(0.030) and summaries[5]["data_s_p50"] < 0.002
    [alarm] = [a for a in summary.alarms if a["kind"] == "straggler"]
    assert alarm["check"] == 6 and alarm["ranks"] == [7]


def test_above_record_ranks_rows_are_kept_around_each_alarm_and_every_n_checks(tmp_path):
    # 80 ranks, record_ranks 64, rows every 10 checks: the straggler alarm at check 6 (slow from
    # 4: three slow checks) keeps checks 4-5 (held back until it came), 6 and 7-8.
    store, entries, summary = run_head(
        tmp_path, world=80, checks=25, slow_from=4, record_ranks=64, record_rows_every=10
    )
    records = RunRecords(RecordStore.at(str(tmp_path / "ormas")))
    kept = sorted(Counter(records.fleet_checks().column("check").to_pylist()).items())
    around = range(6 - AROUND_ALARM, 6 + AROUND_ALARM + 1)
    assert kept == [(c, 80) for c in sorted({0, *around, 10, 20})]
    summaries = records.fleet_summaries().to_pylist()
    assert [s["check"] for s in summaries] == list(range(25))  # every check, in order
    assert [s["check"] for s in summaries if s["full_rows"]] == [c for c, _ in kept]
    assert summary.checks == 25 and summary.ranks[79]["slow_checks"] == len([c for c, _ in kept if c >= 4])
    assert all(s["slow_count"] == 1 and s["slow_ranks"] == [79] for s in summaries[4:])
    # MLflow: the same entries from the live writer as from the record (`ray-ormas mlflow-sync`).
    assert Counter(entries.got) == Counter(fleet_entries(store, "fit"))
    mins = [e for e in entries.got if e[0] == "fleet/min_score"]
    assert len(mins) == 24  # every scored check, rows kept or not


def test_the_record_is_a_few_parquet_parts_that_merge_and_a_cut_merge_neither_loses_nor_doubles(tmp_path):
    store = RecordStore.at(str(tmp_path))
    writer = PartsWriter(store, str(tmp_path / "fleet" / "fit"), CHECKS_TABLE)
    flushes = fleet_tables.MERGE_PARTS**2 + 3
    for check in range(flushes):
        writer.add([{"attempt": 0, "check": check, "rank": r, "node": "n", "data_s": 0.001 * r} for r in range(4)])
        writer.flush()
    folder = tmp_path / "fleet" / "fit" / "checks"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["L0-0000000064-0000000064.parquet", "L0-0000000065-0000000065.parquet",
                     "L0-0000000066-0000000066.parquet", "L2-0000000000-0000000063.parquet"]  # fmt: skip
    table = read_table(store, str(tmp_path / "fleet" / "fit"), CHECKS_TABLE)
    assert table.column("check").to_pylist() == [c for c in range(flushes) for _ in range(4)]
    # The documented one-liners read the same rows.
    assert ds.dataset(str(folder), format="parquet").to_table().num_rows == table.num_rows
    import pandas

    assert len(pandas.read_parquet(folder)) == table.num_rows
    # A merge cut short after its part was written, before the parts it covers were deleted.
    import shutil

    level2 = folder / "L2-0000000000-0000000063.parquet"
    for first in range(0, 64, 8):
        shutil.copy(level2, folder / f"L1-{first:010d}-{first + 7:010d}.parquet")  # stale, covered
    again = read_table(store, str(tmp_path / "fleet" / "fit"), CHECKS_TABLE)
    assert again.column("check").to_pylist() == table.column("check").to_pylist()


def test_a_fleet_record_written_as_json_lines_is_still_read(tmp_path):
    # Version 1 (ray-ormas before the Parquet record): `checks.jsonl`, one line per rank per check.
    folder = tmp_path / "ormas" / "fleet" / "fit"
    folder.mkdir(parents=True)
    (folder / "fleet.json").write_text(json.dumps({"format": "ray-ormas-fleet", "world_size": 2}))
    lines = [
        {"attempt": 0, "check": c, "step": 5 * c, "run_step": 5 * c, "time": 1.0, "rank": r, "node": f"n{r}",
         "data_s": 0.001, "forward_s": 0.01, "wall_s": 0.1, "timed_steps": 5, "loss": 2.0 + r, "nonfinite": False,
         "digest": "abc", "relative_score": None if c == 0 else 1.0 - 0.5 * r, "individual_score": 1.0,
         "slow": c > 0 and r == 1, "slow_in": "data" if c > 0 and r == 1 else None}
        for c in range(3) for r in range(2)
    ]  # fmt: skip
    (folder / "checks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    records = RunRecords(RecordStore.at(str(tmp_path / "ormas")))
    checks = records.fleet_checks().to_pylist()
    assert [{k: v for k, v in c.items() if k != "fit_id"} for c in checks] == lines
    summaries = records.fleet_summaries().to_pylist()
    assert [(s["check"], s["loss_mean"], s["slow_ranks"], s["worst_rank"]) for s in summaries] == [
        (0, 2.5, [], None), (1, 2.5, [1], 1), (2, 2.5, [1], 1)
    ]  # fmt: skip
    store = records.store
    summary = fleet_summary("x", checks, [], summaries=read_fleet_summaries(store, "fit"))
    assert summary.checks == 3 and summary.ranks[1]["slow_checks"] == 2 and summary.loss_rank0 == 2.0
    assert ("fleet/min_score", 0.5, 10) in fleet_entries(store, "fit")


def test_a_fleet_record_of_a_later_version_is_said_not_misread(tmp_path):
    folder = tmp_path / "ormas" / "fleet" / "fit"
    folder.mkdir(parents=True)
    (folder / "fleet.json").write_text('{"format": "ray-ormas-fleet", "version": 3}')
    with pytest.raises(ray_ormas.RecordStorageError, match="has version 3, which this ray-ormas does not read"):
        RunRecords(RecordStore.at(str(tmp_path / "ormas"))).fleet_checks()
