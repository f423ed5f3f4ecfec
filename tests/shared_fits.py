"""Fits that tests in several files read: each runs once per test session, on the session's Ray
cluster, when the first test that needs it asks, and every test that reads it asserts its own
consequence of it (the suite's budget of fits: docs/contributing.md).

* `healthy_fit`: the digits CNN under DDP, 24 steps, a check every 4, a periodic report every 2
  checks, two checkpointed reports of the loop's own, the monitor closed in the loop; fleet
  health and the embedded MLflow store on, as by default. Read by the DDP tests (the record, the
  reports, the checkpoint pointer, MLflow) and the fleet tests (no alarm, replicas agree).
* `watched_fit`: the lesioned digits CNN, watched only (no repair), 40 steps, with fleet health
  off. Read by the DDP tests (the dead layers certified and left dead) and the fleet tests
  (with fleet health off nothing of it runs).
* `failed_fit`: the digits CNN whose loop raises ValueError at step 7 on both ranks, 20 steps
  asked, a check every 2. Read by the DDP tests (the loop's exception reaches `fit()` unchanged,
  the record keeps it) and the MLflow tests (the run is FAILED with the error, the record's files
  are its artifacts).
* `killed_and_repaired_fit`: the lesioned CNN repaired, rank 0 SIGKILLed in epoch 2 and Ray
  resuming from epoch 1's checkpoint, rank 1 slowed in its data loading. Read by the run page's
  test (the page shows the attempts, ranks and alarms) and the fault-tolerance tests (a repair
  before the worker failure stays in the whole run's facts).

* `worker_view_fit`: `worker_view_loop` on 2 workers with a global batch of 48, a Ray dataset
  left unsplit by its `DataConfig`, and a `ValidationConfig`. Read by the trainer-arguments test
  (the dataset and the validation reach the workers) and the strategies test (the epoch helper
  reshuffles every epoch, the global batch is split).

A test that only reads a fit never changes its run folder. (A rerun under a run's name starts a
new segment beside the first and leaves the first unchanged: tests/test_train_command.py checks
it on the digits_repair example's second run.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from ray.train import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
)

from ray_ormas import BatchSize, RayOrmasResult, RayOrmasTrainer

from .loops import digits_loop, resume_loop, validate_checkpoint, worker_view_loop


@dataclass(frozen=True)
class _Run:
    """Where a fit's run is: `storage / name`."""

    storage: Path
    name: str

    @property
    def run_dir(self) -> Path:
        return self.storage / self.name


@dataclass(frozen=True)
class SharedFit(_Run):
    """A fit that returned: its result, and where its run is."""

    result: RayOrmasResult


@pytest.fixture(scope="session")
def healthy_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    storage = tmp_path_factory.mktemp("healthy-fit")
    result = RayOrmasTrainer(
        digits_loop,
        check_every=4,
        report_every=2,
        verbose=False,
        train_loop_config={"steps": 24, "report_at": [8, 16], "checkpoint": True, "close_in_loop": True},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="healthy", storage_path=str(storage), checkpoint_config=CheckpointConfig(num_to_keep=1)
        ),
    ).fit()
    return SharedFit(storage, "healthy", result=result)


@pytest.fixture(scope="session")
def watched_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    storage = tmp_path_factory.mktemp("watched-fit")
    result = RayOrmasTrainer(
        digits_loop,
        repair=False,
        check_every=4,
        fleet=False,
        verbose=False,
        train_loop_config={"steps": 40, "lesion": True},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="watch", storage_path=str(storage)),
    ).fit()
    return SharedFit(storage, "watch", result=result)


@dataclass(frozen=True)
class FailedFit(_Run):
    """A fit that raised: what `fit()` raised, and where its run is."""

    error: TrainingFailedError


@pytest.fixture(scope="session")
def failed_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> FailedFit:
    storage = tmp_path_factory.mktemp("failed-fit")
    trainer = RayOrmasTrainer(
        digits_loop,
        check_every=2,
        verbose=False,
        train_loop_config={"steps": 20, "raise_at": 7},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="boom", storage_path=str(storage)),
    )
    with pytest.raises(TrainingFailedError) as info:
        trainer.fit()
    return FailedFit(storage, "boom", error=info.value)


@pytest.fixture(scope="session")
def killed_and_repaired_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    storage = tmp_path_factory.mktemp("killed-and-repaired-fit")
    result = RayOrmasTrainer(
        resume_loop,
        train_loop_config={
            "epochs": 4,
            "lesion": True,
            "kill_rank": 0,
            "kill_at": 20,  # 4 steps into epoch 2; the last checkpoint is epoch 1's (step 16)
            "kill_marker": str(tmp_path_factory.mktemp("kill-marker") / "killed"),
            "slow_rank": 1,
            "slow_s": 0.04,
        },
        repair=True,
        check_every=3,
        verbose=False,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="paged", storage_path=str(storage), failure_config=FailureConfig(max_failures=1)),
    ).fit()
    return SharedFit(storage, "paged", result=result)


@pytest.fixture(scope="session")
def worker_view_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    import ray.data

    storage = tmp_path_factory.mktemp("worker-view-fit")
    result = RayOrmasTrainer(
        worker_view_loop,
        verbose=False,
        mlflow=False,
        batch=BatchSize(48, per="global"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="worker-view", storage_path=str(storage)),
        datasets={"train": ray.data.from_items([{"x": i} for i in range(8)])},
        dataset_config=DataConfig(datasets_to_split=[]),  # every worker sees all 8 rows
        validation_config=ValidationConfig(fn=validate_checkpoint),
    ).fit()
    return SharedFit(storage, "worker-view", result=result)
