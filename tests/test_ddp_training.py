"""DDP training on a real local Ray cluster (gloo, CPU) with the monitor on every rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import Result, RunConfig, ScalingConfig, TrainingFailedError

from ray_ormas import OptionError, RankMismatchError, RankSyncTimeoutError, RayOrmasTrainer

from .loops import digits_loop, report_count_loop

pytestmark = pytest.mark.usefixtures("ray_cluster")


def diary(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "diary.jsonl").read_text().splitlines()]


def events(path: Path, kind: str) -> list[dict]:
    return [e for e in diary(path) if e["event"] == kind]


def documented_final_keys() -> set[str]:
    """The keys docs/quickstart.md's table of `result.ormas.final` lists."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "quickstart.md").read_text()
    table = text.split("### The keys of `result.ormas.final`")[1].split("\n\n`tests/")[0]
    return set(re.findall(r"^\| `(ormas/[a-z_]+)` \|", table, re.M))


def trainer(storage: Path, name: str, loop=digits_loop, workers: int = 2, **kwargs) -> RayOrmasTrainer:
    kwargs.setdefault("verbose", False)
    return RayOrmasTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=kwargs.pop("run_config", RunConfig(name=name, storage_path=str(storage))),
        **kwargs,
    )


def test_healthy_run_reports_rank0_record_and_per_rank_facts(healthy_fit):
    storage, result = healthy_fit.storage, healthy_fit.result
    assert isinstance(result, Result)
    assert result.return_value["model_type"] == "DistributedDataParallel"
    run = result.ormas

    # Rank 0 wrote one record, in its own segment, and it verifies; no other rank wrote anything.
    root = storage / "healthy" / "ormas" / "model"
    assert run.record_dir == root / "segment-000"
    assert [p.name for p in root.iterdir()] == ["segment-000"]
    assert sorted(p.name for p in run.record_dir.iterdir()) == [
        "diary.jsonl",
        "metrics.jsonl",
        "report.html",
        "segment.json",
        "summary.html",
        "summary.md",
    ]
    assert verify_run(run.record_dir).ok
    assert result.return_value["closed"] == str(run.record_dir / "report.html") == str(run.report)
    manifest = events(run.record_dir, "manifest")[0]
    assert manifest["distributed"]["mode"] == "ddp" and manifest["distributed"]["world_size"] == 2
    assert diary(run.record_dir)[-1]["event"] == "run_end" and "error" not in diary(run.record_dir)[-1]

    # Reports: 24 steps / check_every 4 = 6 checks -> periodic at checks 2, 4, 6; the user's two
    # reports; the final one. Every rank made every report, in the same order.
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["periodic", "user", "periodic", "user", "periodic", "final"]
    for i, per_rank in enumerate(run.reports):
        assert [r["ormas/rank"] for r in per_rank] == [0, 1]
        assert [r["ormas/report_index"] for r in per_rank] == [i, i]
        assert "ormas/loss" in per_rank[0] and "ormas/loss" not in per_rank[1]  # rows are rank 0's
        assert all(isinstance(r["ormas/rank_loss"], float) for r in per_rank)  # facts are every rank's
        assert per_rank[0]["ormas/param_digest"] == per_rank[1]["ormas/param_digest"]
    assert set(run.final) == documented_final_keys() - {"ormas/effective_batch"}  # no batch setting here
    assert run.final["ormas/steps_per_rank"] == [24, 24]
    assert run.final["ormas/checks"] == 6 and run.final["ormas/check_step"] == 20
    # Reports carry counts; the events are in the record (structure, manifest, ... at least two).
    assert sum(per_rank[0]["ormas/new_events"] for per_rank in run.reports) == len(
        [e for e in diary(run.record_dir) if e["event"] not in ("run_start", "run_end")]
    )
    assert all("ormas/events" not in r for per_rank in run.reports for r in per_rank)

    # Result.metrics is the last *checkpoint* report's: the user's second report, ormas facts merged.
    assert result.metrics["user_step"] == 16 and result.metrics["ormas/kind"] == "user"
    assert result.checkpoint is not None
    kept = [p for p in (storage / "healthy").iterdir() if p.is_dir() and p.name.startswith("checkpoint_")]
    assert len(kept) == 1  # the user's num_to_keep=1, untouched
    # ... and it points into the record as it was then: checks at steps 0, 4, 8, 12 (of 16).
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    lines = diary(run.record_dir)
    assert pointer["segment"] == "segment-000" and pointer["steps"] == pointer["run_steps"] == 16
    assert pointer["metrics_rows"] == 4 and lines[pointer["events"] - 1]["hash"] == pointer["last_hash"]

    # MLflow by default: an embedded store in the run directory, one finished run with the record.
    assert run.tracking_uri == f"sqlite:///{storage / 'healthy' / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(run.tracking_uri)
    tracked = client.get_run(run.mlflow_run_id)
    assert tracked.info.status == "FINISHED" and tracked.data.metrics["ormas/loss"] == run.final["ormas/loss"]
    assert {Path(f.path).name for f in client.list_artifacts(run.mlflow_run_id, "ormas/model/segment-000")} == {
        "diary.jsonl",
        "metrics.jsonl",
        "report.html",
        "segment.json",
        "summary.html",
        "summary.md",
    }


@pytest.mark.timeout(300)
def test_repair_is_identical_on_every_rank(repaired_example_fit):
    # examples/digits_ddp.py's repaired run (tests/shared_fits.py): the lesioned CNN, 3 epochs, a
    # check every 10 steps, the loop's own report after each epoch.
    run = repaired_example_fit.result.ormas
    certificates = events(run.record_dir, "certificate")
    repairs = events(run.record_dir, "repair")
    assert {e["layer"] for e in certificates} == {"conv2.0", "conv3.0"}
    assert {e["layer"] for e in repairs} == {"conv2.0", "conv3.0"}
    assert run.final["ormas/channels_repaired"] == 32 + 64
    first_repair_step = min(e["step"] for e in repairs)
    digests = run.digests()
    assert len(digests) == 3 + 1  # a report per epoch, then ray-ormas's final one
    for per_rank in digests:  # equal at every report, repairs included
        assert len(set(per_rank)) == 1
    after = [i for i, per_rank in enumerate(run.reports) if per_rank[0]["ormas/check_step"] >= first_repair_step]
    assert after, "no report after the repair"
    # The repaired layers live: nothing stuck at the end, and gradients reach them at the last check.
    assert run.final["ormas/stuck_channels"] == 0
    last = [json.loads(line) for line in (run.record_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["grad"]["conv2.0"] > 0 and last["grad"]["conv3.0"] > 0, last
    assert verify_run(run.record_dir).ok


def test_watch_only_leaves_layers_dead(watched_fit):
    watched = watched_fit.result
    w = watched.ormas
    assert {e["layer"] for e in events(w.record_dir, "certificate")} == {"conv2.0", "conv3.0"}
    assert events(w.record_dir, "repair") == []
    assert watched.return_value["conv2_abs"] == 0 and watched.return_value["conv3_abs"] == 0
    assert w.final["ormas/stuck_channels"] == 32 + 64 and w.final["ormas/channels_repaired"] == 0


@pytest.mark.smoke
@pytest.mark.timeout(240)
def test_the_loops_exception_reaches_fit_unchanged_and_the_record_keeps_it(failed_fit):
    storage = failed_fit.storage
    failures = failed_fit.error.worker_failures
    # Both ranks raise; Ray Train reports the ranks whose error it has seen at the poll that
    # fails the group. Rank 1 lets rank 0 finish the record first, then both raise within
    # milliseconds, so either one's error may come a poll too late (CI once saw rank 1's alone).
    # Whichever Ray reports is the loop's own exception, unchanged; the record keeps rank 0's.
    assert failures and set(failures) <= {0, 1}
    for rank, error in failures.items():
        assert type(error) is ValueError and str(error) == f"boom at step 7 on rank {rank}"
    record = storage / "boom" / "ormas" / "model" / "segment-000"
    end = diary(record)[-1]
    assert end["event"] == "run_end" and end["error"] == "ValueError: boom at step 7 on rank 0"
    assert end["steps"] == 7
    assert verify_run(record).ok


@pytest.mark.timeout(180)
def test_repair_without_the_optimizer_is_a_clear_error(storage):
    # Raised where the monitor is built, the same on every rank: Ray Train's local mode (the loop
    # in this process, no worker group to start) raises the loop's own error as it is.
    t = trainer(storage, "noopt", workers=0, repair=True, train_loop_config={"steps": 4, "no_optimizer": True})
    with pytest.raises(ValueError) as info:
        t.fit()
    error = info.value
    assert type(error) is OptionError and "call ray_ormas.monitor(model, optimizer)" in str(error)  # a ValueError


@pytest.mark.timeout(180)
def test_uneven_ddp_loaders_fail_with_a_clear_error_instead_of_hanging(storage):
    # Rank 1 has two more batches: its third-last backward waits in DDP's all-reduce for rank 0,
    # which has left its loop. Rank 0 waits at the final report, then names the missing rank.
    t = trainer(
        storage, "uneven", check_every=2, sync_timeout_s=5, train_loop_config={"steps_by_rank": {"0": 6, "1": 8}}
    )
    with pytest.raises(TrainingFailedError) as info:
        t.fit()
    error = info.value.worker_failures[0]
    assert isinstance(error, RankSyncTimeoutError)
    assert "for rank(s) [1], which never arrived" in str(error) and "same number of batches" in str(error)


@pytest.mark.timeout(180)
def test_ranks_reporting_different_numbers_of_times_fail_at_once(storage):
    t = trainer(
        storage,
        "mismatch",
        loop=report_count_loop,
        sync_timeout_s=60,
        train_loop_config={"reports_by_rank": {"0": 2, "1": 1}},
    )
    with pytest.raises(TrainingFailedError) as info:
        t.fit()
    errors = info.value.worker_failures
    assert errors and all(isinstance(e, RankMismatchError) for e in errors.values())
    text = str(next(iter(errors.values())))
    assert "rank 0 called ray_ormas.report" in text and "rank 1 finished its loop" in text
