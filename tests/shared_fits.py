"""Fits that tests in several files read: each runs once per test session, on the session's Ray
cluster, when the first test that needs it asks, and every test that reads it asserts its own
consequence of it (the suite's budget of fits: docs/contributing.md).

* `healthy_fit`: the digits CNN under DDP, 24 steps (0.3 s each), a check every 4, a periodic
  report every 2 checks, two checkpointed reports of the loop's own (Ray keeping only the last),
  the monitor closed in the loop, rank 0's own clock of each step in `steps.jsonl` (and the
  driver's of `fit()`, for the goodput tests); fleet health and the embedded MLflow store on, as by default,
  with an experiment, a tag and every checkpoint logged, nested and long params, and a secret in
  the environment that is also a param (what it printed is kept). Read by the DDP tests (the
  record, the reports, the checkpoint pointer, MLflow), the fleet tests (no alarm, replicas
  agree) and the MLflow tests (one complete run: params flattened, truncated and scrubbed; every
  checkpoint uploaded before Ray's num_to_keep deleted it).
* `watched_fit`: the lesioned digits CNN, watched only (no repair), 40 steps, with fleet health
  off. Read by the DDP tests (the dead layers certified and left dead) and the fleet tests
  (with fleet health off nothing of it runs).
* `failed_fit`: the digits CNN whose loop raises ValueError at step 7 on both ranks, 20 steps
  asked, a check every 2; before that, rank 1's loss is NaN at step 4 (a bad night of two faults:
  the NaN changes nothing the error's consequences are read from). Read by the DDP tests (the
  loop's exception reaches `fit()` unchanged, the record keeps it), the MLflow tests (the run is
  FAILED with the error, the record's files are its artifacts) and the fleet tests (the NaN is
  named with its rank, step and layer, in the fleet record of a fit that then failed).
* `killed_and_repaired_fit`: the lesioned CNN repaired, 8 epochs, rank 0 SIGKILLed in epoch 2 and
  Ray resuming from epoch 1's checkpoint, rank 1 slowed in its data loading; rank 0's own clock
  of each step and of the kill in `steps.jsonl` (the goodput tests). Read by the run
  page's test (the page shows the attempts, ranks and alarms) and the fault-tolerance tests (a
  repair before the worker failure stays in the whole run's facts; the resume is bit-identical
  to that module's uninterrupted run of the same loop, lesion and repair, and its segments link).

* `busy_fit`: a bad night of four faults that do not touch each other's signal: a tiny CNN (a
  forward of about 1 ms) on a machine oversubscribed twice over (timings: rank 0 starts two
  processes that spin while the loop runs), rank 1's weights changed outside DDP after step 22
  (digests), rank 1 stuck for 2.5 times the hang bound between step 100's backward and its check
  (the head's hang watch; one slow check is no straggler), and the loss multiplied by 10^4 from
  step 150 on every rank (gradients); 200 steps, a check every 5, no MLflow. While it trains,
  rank 0 reads the head node's metrics endpoint as Prometheus would, into `metrics.txt` beside
  the run (a gauge of a run that ended leaves Ray's export about 20 s later). Read by the fleet
  tests (no straggler named, divergence at the next check, the hang named, Ray's metrics) and
  the strategies test (DDP's gradient alarms fire when gradients explode).

* `repaired_example_fit`: examples/digits_ddp.py's `main`, as its test calls it: the lesioned
  digits CNN repaired, 3 epochs on 2 workers, a report per epoch. Read by the examples' test (the
  example runs as written) and the DDP tests (the repair is the same on every rank).

* `worker_view_fit`: `worker_view_loop` on 2 workers with a global batch of 48, a Ray dataset
  left unsplit by its `DataConfig`, and a `ValidationConfig`. Read by the trainer-arguments test
  (the dataset and the validation reach the workers) and the strategies test (the epoch helper
  reshuffles every epoch, the global batch is split).

A test that only reads a fit never changes its run folder. (A rerun under a run's name starts a
new segment beside the first and leaves the first unchanged: tests/test_train_command.py checks
it on the digits_repair example's second run.)
"""

from __future__ import annotations

import contextlib
import io
import os
import time
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

from ray_ormas import BatchSize, FleetSettings, MLflowSettings, RayOrmasResult, RayOrmasTrainer
from ray_ormas._internal.head.fleet_metrics import ACTIONS_EXPORTED, EXPORTED, PREFLIGHT_EXPORTED
from ray_ormas._internal.head.goodput_keeper import GOODPUT
from ray_ormas._internal.head.goodput_keeper import SECONDS as GOODPUT_SECONDS

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
    """A fit that returned: its result, where its run is, and what it printed when that was kept."""

    result: RayOrmasResult
    printed: str = ""
    called: float = 0.0  # time.time() right before fit() (the goodput tests), when kept
    returned: float = 0.0  # ... and right after it returned

    @property
    def step_log(self) -> Path:
        """The loop's own clock, when its config had `step_log` (tests/loops.py `log_step`)."""
        return self.storage / "steps.jsonl"


HANG_AFTER_S = 6.0  # busy_fit's hang bound (FleetSettings.hang_after_s): 5x its longest check interval in CI (1.2 s)
SECRET = "s3cr3t-t0ken"  # healthy_fit's MLFLOW_TRACKING_TOKEN, and a param's value


@pytest.fixture(scope="session")
def healthy_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    storage = tmp_path_factory.mktemp("healthy-fit")
    config = {
        "steps": 24,
        "report_at": [8, 16],
        "checkpoint": True,
        "close_in_loop": True,
        "sleep_per_step": 0.3,
        "opt": {"betas": [0.9, 0.99], "sched": {"warmup": 3}},
        "long": "x" * 7000,
        "api": SECRET,
        "step_log": str(storage / "steps.jsonl"),
    }
    out, err = io.StringIO(), io.StringIO()
    os.environ["MLFLOW_TRACKING_TOKEN"] = SECRET
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            called = time.time()
            result = RayOrmasTrainer(
                digits_loop,
                check_every=4,
                report_every=2,
                verbose=False,
                mlflow=MLflowSettings(experiment_name="one-run", tags={"team": "vision"}, log_checkpoints="all"),
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    name="healthy", storage_path=str(storage), checkpoint_config=CheckpointConfig(num_to_keep=1)
                ),
            ).fit()
            returned = time.time()
    finally:
        del os.environ["MLFLOW_TRACKING_TOKEN"]
    printed = out.getvalue() + err.getvalue()
    return SharedFit(storage, "healthy", result=result, printed=printed, called=called, returned=returned)


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
        train_loop_config={"steps": 20, "raise_at": 7, "nan_rank": 1, "nan_at": 4},
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
            "epochs": 8,
            "lesion": True,
            "kill_rank": 0,
            "kill_at": 20,  # 4 steps into epoch 2; the last checkpoint is epoch 1's (step 16)
            "kill_marker": str(tmp_path_factory.mktemp("kill-marker") / "killed"),
            "slow_rank": 1,
            "slow_s": 0.04,
            "step_log": str(storage / "steps.jsonl"),
        },
        repair=True,
        check_every=3,
        verbose=False,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="paged", storage_path=str(storage), failure_config=FailureConfig(max_failures=1)),
    ).fit()
    return SharedFit(storage, "paged", result=result)


@pytest.fixture(scope="session")
def busy_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    storage = tmp_path_factory.mktemp("busy-fit")
    result = RayOrmasTrainer(
        digits_loop,
        check_every=5,
        verbose=False,
        mlflow=False,
        train_loop_config={
            "steps": 200,
            "tiny": True,
            "spinners": 2,
            "nudge_rank": 1,
            "nudge_at": 22,
            "stall_rank": 1,
            "stall_at": 100,
            "stall_s": HANG_AFTER_S * 2.5,
            "explode_at": 150,
            "scrape_to": str(storage / "metrics.txt"),
            "scrape_until": [
                ACTIONS_EXPORTED,
                PREFLIGHT_EXPORTED,
                *EXPORTED.values(),
                f"ray_{GOODPUT}",
                f"ray_{GOODPUT_SECONDS}",
                'action="log"',
                'kind="hang"',
                'run="busy"',
            ],
        },
        # The hang's action and the policy only capture stacks: the training is not changed.
        fleet=FleetSettings(
            hang_after_s=HANG_AFTER_S, actions={"hang": "diagnose"}, policy="tests.loops:diagnose_rank_1_at_check_3"
        ),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="busy", storage_path=str(storage)),
    ).fit()
    return SharedFit(storage, "busy", result=result)


@pytest.fixture(scope="session")
def repaired_example_fit(ray_cluster, tmp_path_factory: pytest.TempPathFactory) -> SharedFit:
    from examples import digits_ddp

    storage = tmp_path_factory.mktemp("repaired-example-fit")
    result = digits_ddp.main(workers=2, epochs=3, repair=True, storage_path=str(storage))
    return SharedFit(storage, "digits-example-repair", result=result)


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
