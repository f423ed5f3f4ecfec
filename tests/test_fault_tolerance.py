"""What survives what, on a real local Ray cluster: persistence through a non-local pyarrow
filesystem, a SIGKILLed worker resumed exactly from its checkpoint, and linked segments."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem
from ray.train import Checkpoint, RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer, open_records

from .conftest import temporary_folders
from .loops import resume_loop

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS_PER_EPOCH = 8  # 512 samples / 2 ranks / batch 32


def fit(name: str, run_config: RunConfig, **config) -> object:
    """resume_loop on 2 workers as the shared killed-and-repaired fit runs it (the lesioned CNN,
    repaired, a check every 3), without MLflow and without a fault."""
    return RayOrmasTrainer(
        resume_loop,
        train_loop_config={"lesion": True, **config},
        repair=True,
        check_every=3,
        verbose=False,
        mlflow=False,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config,
    ).fit()


def lines(data: bytes) -> list[dict]:
    return [json.loads(x) for x in data.splitlines()]


@dataclass(frozen=True)
class BucketFit:
    result: Any
    bucket: Path
    new_temporary_folders: dict[str, int]


UPLOAD_MODES = ["SYNC", "ASYNC"]  # Ray's CheckpointUploadMode, one per epoch in turn


@pytest.fixture(scope="module")
def bucket_fit(tmp_path_factory: pytest.TempPathFactory) -> BucketFit:
    """8 epochs of the lesioned CNN, repaired, into a non-local filesystem (a folder seen through
    SubTreeFileSystem), the checkpoints uploaded each of Ray's ways in turn (SYNC, ASYNC, SYNC,
    ...: an asynchronous upload may still run when the next, synchronous, report comes), rank 0
    reading the record in storage back after each report; with the temp folders it left on the node."""
    bucket = tmp_path_factory.mktemp("bucket") / "bucket"
    bucket.mkdir()
    before = temporary_folders()
    fs = SubTreeFileSystem(str(bucket), LocalFileSystem())
    result = fit(
        "disk",
        RunConfig(name="disk", storage_path="runs", storage_filesystem=fs),
        epochs=8,
        upload_mode=UPLOAD_MODES,
        storage_root=str(bucket),
        storage_check="runs/disk/ormas/model/segment-000/diary.jsonl",
    )
    left = {name: size for name, size in temporary_folders().items() if name not in before}
    return BucketFit(result, bucket, left)


@pytest.mark.timeout(300)
def test_the_record_persists_through_a_non_local_filesystem_at_every_checkpoint(bucket_fit):
    result, bucket = bucket_fit.result, bucket_fit.bucket
    fs = SubTreeFileSystem(str(bucket), LocalFileSystem())
    segment = "runs/disk/ormas/model/segment-000"
    run = result.ormas
    assert run.record_dir is None and run.records == {"model": segment} and not run.store.is_local

    # Everything is in storage: the record, its reports, its link; it verifies there.
    stored = bucket / segment
    assert sorted(p.name for p in stored.iterdir()) == [
        "diary.jsonl",
        "metrics.jsonl",
        "report.html",
        "segment.json",
        "summary.html",
        "summary.md",
    ]
    assert verify_run(stored).ok
    diary = lines((stored / "diary.jsonl").read_bytes())

    # At each checkpoint the record in storage was already up to it (read by rank 0 right after
    # each report), and the checkpoint's metadata points at exactly that prefix.
    checkpoints = sorted(p for p in (bucket / "runs" / "disk").glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 8
    seen = result.return_value["persisted_lines"]
    for i, path in enumerate(checkpoints):
        pointer = Checkpoint(str(path.relative_to(bucket)), fs).get_metadata()["ormas"]["model"]
        assert pointer["steps"] == STEPS_PER_EPOCH * (i + 1) and pointer["path"] == segment
        assert diary[pointer["events"] - 1]["hash"] == pointer["last_hash"]
        assert pointer["metrics_rows"] == -(-pointer["steps"] // 3)  # checks at 0, 3, 6, ...
        assert seen[i] >= pointer["events"]
    assert seen[0] < len(diary)  # persisted mid-run, not only at the end


@pytest.mark.timeout(300)
def test_many_checkpoints_leave_no_temporary_copies_and_the_pointer_stays_right(bucket_fit):
    result, bucket, left = bucket_fit.result, bucket_fit.bucket, bucket_fit.new_temporary_folders
    fs = SubTreeFileSystem(str(bucket), LocalFileSystem())
    checkpoints = sorted(p for p in (bucket / "runs" / "disk").glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 8
    one = sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file())
    # Rank 0 wrote 8 checkpoints and staged the record for a non-local store: at most one
    # checkpoint's worth is left (none, in fact), and the record's staging folder is gone.
    assert sum(left.values()) <= one, left
    assert not [n for n in left if n.startswith("ray-ormas-model-")], left
    # Each checkpoint, uploaded in the background or not, points at the record as of its epoch.
    diary = lines((bucket / result.ormas.records["model"] / "diary.jsonl").read_bytes())
    for i, path in enumerate(checkpoints):
        checkpoint = Checkpoint(str(path.relative_to(bucket)), fs)
        pointer = checkpoint.get_metadata()["ormas"]["model"]
        assert pointer["steps"] == STEPS_PER_EPOCH * (i + 1)
        assert diary[pointer["events"] - 1]["hash"] == pointer["last_hash"]
    assert verify_run(bucket / result.ormas.records["model"]).ok


@pytest.mark.timeout(420)
def test_a_killed_worker_resumes_from_its_checkpoint_bit_identical_with_linked_segments(
    killed_and_repaired_fit, bucket_fit
):
    # The shared killed-and-repaired fit (tests/shared_fits.py): rank 0 SIGKILLs itself 4 steps
    # into epoch 2, after the lesion's repair. The uninterrupted run to compare with: the bucket
    # fit, the same loop, lesion, repair and 8 epochs (where and how the record and checkpoints
    # are stored, MLflow, and rank 1's slow data loading change nothing of the training).
    reference = bucket_fit.result
    resumed, storage = killed_and_repaired_fit.result, killed_and_repaired_fit.storage
    kill_at = 2 * STEPS_PER_EPOCH + 4

    # It resumed from the last checkpoint Ray had registered: epoch 1's, or epoch 0's when the
    # controller had not yet processed epoch 1's report when rank 0 died 4 steps later (seen under load).
    epoch = resumed.return_value["resumed_from_epoch"]
    assert epoch in (0, 1) and resumed.return_value["step"] == 8 * STEPS_PER_EPOCH
    offset = STEPS_PER_EPOCH * (epoch + 1)
    # Parameters bit-identical to the uninterrupted run (every rank's digest, after the same steps).
    assert reference.ormas.final["ormas/param_digest"] == resumed.ormas.final["ormas/param_digest"]
    assert len(set(resumed.ormas.digests()[-1])) == 1
    assert 0 in resumed.ormas.worker_errors[0]  # the killed rank, as the controller saw it

    # Two segments: the killed attempt's (no run_end, every row up to the kill on disk), and the
    # resumed one, linked to it and to the checkpoint it resumed from.
    records = open_records(storage / "paged")
    first, second = records.segments()
    assert not first.complete and second.complete
    killed_rows = lines((storage / "paged/ormas/model/segment-000/metrics.jsonl").read_bytes())
    assert [r["step"] for r in killed_rows] == list(range(0, kill_at, 3))  # 0, 3, ..., 18: none lost
    checks = {c.name: c.status for c in verify_run(first.path).checks}
    assert checks["chain"] == "pass" and checks["bookends"] == "fail"  # verify: "no run_end"
    assert verify_run(second.path).ok
    link = second.link
    assert link["attempt"] == 1 and first.link["attempt"] == 0 and link["fit_id"] == first.link["fit_id"]
    assert link["previous"]["segment"] == "segment-000" and link["previous"]["complete"] is False
    assert (
        link["previous"]["last_hash"]
        == lines((storage / "paged/ormas/model/segment-000/diary.jsonl").read_bytes())[-1]["hash"]
    )
    assert link["step_offset"] == offset
    assert link["resumed_from"]["record"]["segment"] == "segment-000"
    assert link["resumed_from"]["checkpoint"].startswith(str(storage / "paged" / "checkpoint_"))

    # Read back: the run's steps line up across the two segments, as in the whole run's record.
    metrics = records.metrics()
    run_steps = metrics.column("run_step").to_pylist()
    assert run_steps == list(range(0, kill_at, 3)) + [offset + s for s in range(0, 8 * STEPS_PER_EPOCH - offset, 3)]
    whole = open_records(bucket_fit.bucket / "runs" / "disk").metrics()
    assert whole.column("run_step").to_pylist()[:7] == run_steps[:7]
    assert whole.column("loss").to_pylist()[:7] == metrics.column("loss").to_pylist()[:7]


@pytest.mark.timeout(420)
def test_a_repair_before_a_worker_failure_stays_in_the_whole_runs_facts(killed_and_repaired_fit):
    """A lesioned CNN repaired in attempt 0, a worker killed in epoch 2, Ray resuming from a
    checkpoint (tests/shared_fits.py): `final`, the per-segment rows and the MLflow run's end give
    the whole run."""
    result = killed_and_repaired_fit.result
    rows = result.ormas.segments
    assert [(r["monitor"], r["attempt"]) for r in rows] == [("model", 0), ("model", 1)] and rows[1]["complete"]
    assert rows[0]["channels_repaired"] > 0  # the repair happened in the attempt that failed
    events = result.ormas.open_records().events().to_pylist()
    repairs = [json.loads(e["line"]) for e in events if e["event"] == "repair"]
    final = result.ormas.final
    assert final["ormas/repairs"] == len(repairs) == sum(r["repairs"] for r in rows)
    assert (
        final["ormas/channels_repaired"]
        == sum(r["count"] for r in repairs)
        == sum(r["channels_repaired"] for r in rows)
    )
    assert final["ormas/certificates"] == sum(e["event"] == "certificate" for e in events) > 0
    assert final["ormas/alarms"] == sum(e["event"] == "alarm" for e in events)
    assert final["ormas/checks"] == sum(r["checks"] for r in rows) == len(result.ormas.open_records().metrics())
    assert final["ormas/segments"] == 2
    assert final["ormas/stuck_channels"] == rows[-1]["stuck_channels_at_end"] == 0  # the state at the end
    # The MLflow run (the embedded store) ends with the same counts.
    run = MlflowClient(result.ormas.tracking_uri).get_run(result.ormas.mlflow_run_id)
    for key in ("ormas/repairs", "ormas/channels_repaired", "ormas/certificates", "ormas/checks", "ormas/segments"):
        assert run.data.metrics[key] == final[key], key
