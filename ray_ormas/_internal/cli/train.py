"""`ray-ormas train CONFIG.yaml`: config -> RayOrmasTrainer -> fit -> summary, with exit codes.

    0  trained; the summary says where the record, its report and the MLflow run are
    1  training failed (the root cause in one paragraph, and where the failed run's record is)
    2  the config or one of its values is wrong, or the storage is unusable: nothing was trained

Everything the driver can check is checked before Ray starts: the schema (common/job_config.py), the
imports of `module:function` targets, the storage locations (driver/paths.py: a relative path is made
absolute against the current directory, and said so; refused under `ray job submit`), the values
Ray's own configs refuse (named by their key), then everything `RayOrmasTrainer(...)` checks
(batch split, repair with FSDP, SyncBatchNorm without GPUs, writable storage). Then Ray: a local
cluster when none is running (the current directory goes on the workers' PYTHONPATH, so
`module:function` targets import there too), which must be able to place the workers
(driver/capacity.py: it cannot grow), or the running cluster (under `ray job submit`, whose
`--working-dir` does the same for the workers). Long waits say what they wait for.

Hooks relied on: `ray.init` (RAY_ADDRESS), `ray.cluster_resources`, and the public API of
ray-ormas.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Literal

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.job_config import ConfigError, JobConfig, load_config, load_target
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.driver.capacity import check_capacity, lone_node_eviction, per_worker
from ray_ormas._internal.driver.failures import describe_failure
from ray_ormas._internal.driver.paths import StoragePathError, resolve_location
from ray_ormas._internal.record.store import RecordStorageError
from ray_ormas._internal.tracking.values import shown

logger = get_logger("ray_ormas.train_command")  # notes, prefixed by get_logger
# The command's own lines ("ray-ormas train: ...") speak as the command, without the notes' prefix.
command_logger = logging.getLogger("ray_ormas.train_command")

CLI_SCALING_KEYS = {"workers": "scaling.workers", "resources": "scaling.resources_per_worker"}


def say(message: str) -> None:
    logger.info("%s", message)


def train(path: str, overrides: list[str], *, dry_run: bool = False) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `module:function` targets import like `python -m`
    try:
        job = load_config(path, overrides)
        job, notes = resolve_storage(job, path)
        trainer = build_trainer(job)
    except ConfigError as e:
        command_logger.error("ray-ormas train: %s", e)
        return 2
    except (ValueError, TypeError, RecordStorageError) as e:
        command_logger.error("ray-ormas train: %s: %s", path, e)
        return 2
    for note in notes:
        say(note)
    if dry_run:
        import yaml

        print(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False), end="")
        say("config is valid; --dry-run started nothing")
        return 0
    trainer._announce_continuation()  # the first line, when this continues an existing run
    shortfall = _start_ray(job)
    if shortfall is not None:
        command_logger.error("ray-ormas train: %s: %s", path, shortfall)
        return 2
    say(
        f"training {job.name!r}: {job.scaling.describe()}, strategy {job.strategy}, "
        f"{job.train.epochs} epoch(s); waiting for Ray Train to start the workers ..."
    )
    started = time.monotonic()
    try:
        result = trainer.fit()
    except KeyboardInterrupt:
        command_logger.error("ray-ormas train: interrupted")
        return 1
    except BaseException as e:  # Ray's own errors, and the loop's, end the run: exit 1
        if isinstance(e, SystemExit) and e.code in (0, None):
            raise
        command_logger.error(
            "ray-ormas train: training failed after %.0f s: %s", time.monotonic() - started, describe_failure(e)
        )
        return 1
    from ray_ormas._internal.cli.summary import render

    run = result.ormas
    mlflow = mlflow_line(run)
    final = {k: v for k, v in (result.metrics or {}).items() if not keys.is_ormas(k)}
    say(f"finished in {time.monotonic() - started:.0f} s; final metrics: {json.dumps(final, default=str)}")
    print(render(run.store, run.records, mlflow, run.fleet, run.run_page), flush=True)
    return 0


def mlflow_line(run: Any) -> str | None:
    """The summary's MLflow line: where the run is, and how to complete it after an outage."""
    if run.mlflow_complete is None:
        return None
    where = f"run {run.mlflow_run_id or '(not created: the tracker was down)'} at {shown(run.tracking_uri or '?')}"
    if run.mlflow_complete:
        return where
    return (
        f"{where}, INCOMPLETE: the tracker was unreachable; complete it later with: "
        f"ray-ormas mlflow-sync {run.store.shown()}"
    )


def resolve_storage(job: JobConfig, source: str) -> tuple[JobConfig, list[str]]:
    """The job with `storage.path` and `storage.record_dir` resolved (driver/paths.py), and what was
    rewritten, for the progress output; a location that cannot work is a ConfigError."""
    storage = job.storage
    update: dict[str, str] = {}
    notes: list[str] = []
    for key in ("path", "record_dir"):
        value = getattr(storage, key)
        if value is None:
            continue
        try:
            resolved = resolve_location(value, f"storage.{key}")
        except StoragePathError as e:
            raise ConfigError(f"{source}: {e}") from None
        update[key] = resolved.location
        if resolved.note:
            notes.append(resolved.note)
    return job.model_copy(update={"storage": storage.model_copy(update=update)}), notes


def build_trainer(job: JobConfig) -> Any:
    """The `RayOrmasTrainer` a config describes (its own checks run here, on the driver)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from ray_ormas._internal.driver.trainer import RayOrmasTrainer
    from ray_ormas._internal.worker.supervised_loop import supervised_loop

    loop = load_target(job.loop.target) if job.loop is not None else supervised_loop
    # The config's sections are the API's own settings classes (common/options.py); an untouched
    # `fleet:` stays the default, which is off by itself with one worker.
    fleet: FleetSettings | bool = True if job.fleet == FleetSettings() else job.fleet
    with _named("scaling"):
        scaling = ScalingConfig(
            num_workers=job.scaling.num_workers,
            use_gpu=job.scaling.use_gpu,
            resources_per_worker=dict(job.scaling.resources_per_worker) or None,
        )
    with _named("failure"):
        failure = FailureConfig(
            max_failures=job.failure.max_failures, controller_failure_limit=job.failure.controller_failure_limit
        )
    with _named("train.keep_checkpoints"):
        checkpoints = CheckpointConfig(num_to_keep=job.train.keep_checkpoints)
    with _named("storage.path"):
        run_config = RunConfig(
            name=job.name, storage_path=job.storage.path, failure_config=failure, checkpoint_config=checkpoints
        )
    return RayOrmasTrainer(
        loop,
        train_loop_config=job.model_dump(mode="json"),
        monitor=job.monitor,  # the YAML's monitor: section is a MonitorSettings
        record_dir=job.storage.record_dir,
        strategy=job.strategy,
        sync_batchnorm=job.sync_batchnorm,
        batch=job.train.batch,
        mlflow=job.mlflow,
        fleet=fleet,
        scaling_config=scaling,
        run_config=run_config,
    )


class _named:
    """Turn a ValueError/TypeError from one of Ray's config classes into a ConfigError naming the key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> Literal[False]:
        if isinstance(error, (ValueError, TypeError)) and not isinstance(error, ConfigError):
            raise ConfigError(f"{self.key}: {error}") from None
        return False


def _start_ray(job: JobConfig) -> str | None:
    """Start or join Ray and say what the cluster has against what the workers need. Returns
    why the workers can never be placed when the cluster was started here (it cannot grow), else
    None; on a joined cluster a shortfall is only said (an autoscaler may add nodes)."""
    import ray

    if ray.is_initialized():
        return None
    address = os.environ.get("RAY_ADDRESS")
    if address:
        say(f"connecting to the Ray cluster at {address} ...")
        ray.init(log_to_driver=True)
    else:
        say("no RAY_ADDRESS: starting a local Ray cluster (or joining one started with `ray start` here) ...")
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}})
    from ray.train import ScalingConfig

    scaling = ScalingConfig(
        num_workers=job.scaling.num_workers,
        use_gpu=job.scaling.use_gpu,
        resources_per_worker=dict(job.scaling.resources_per_worker) or None,
    )
    have, need = ray.cluster_resources(), per_worker(scaling)
    say(
        f"Ray is up: {have.get('CPU', 0):g} CPUs, {have.get('GPU', 0):g} GPUs in the cluster; the workers need "
        f"{job.scaling.min_workers * need.get('CPU', 0):g} CPUs, {job.scaling.min_workers * need.get('GPU', 0):g} GPUs"
    )
    shortfall = check_capacity(scaling, keys=CLI_SCALING_KEYS)
    # A joined cluster may grow: fit() only warns of an evict that cannot act then.
    lone = None if address else lone_node_eviction(job.fleet, option="fleet.actions")
    if shortfall is None and lone is None:
        return None
    if not address:
        ray.shutdown()
        said = ". ".join(problem for problem in (shortfall, lone) if problem)
        return f"{said}. (This Ray cluster was started on this machine and cannot grow.)"
    say(
        f"the cluster cannot place the workers yet ({shortfall}): Ray Train waits for it to grow (an "
        f"autoscaler) and gives up after RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S per try "
        f"(failure.controller_failure_limit tries)"
    )
    return None
