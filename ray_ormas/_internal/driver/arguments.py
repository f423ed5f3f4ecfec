"""The trainer's arguments, checked and resolved on the driver before anything starts.

`check_arguments` is everything `RayOrmasTrainer.__init__` refuses or settles, in one place and
in this order: the loop's signature, the strategy, the monitor's settings (driver/monitor_options.py),
the scaling and run configs, FSDP with repair or local mode, SyncBatchNorm without GPUs, a
global batch that does not split over the workers, that the record's storage can be written,
the MLflow and fleet settings, the frameworks the loop uses, and Ray Train's own checks of its
arguments. Each refusal is a `RayOrmasError` (ray_ormas/errors.py) whose message says what to do.

Hooks relied on: `ray.train.ScalingConfig` and `RunConfig` (types and fields), and building a
`TorchTrainer` (Ray Train checks its arguments in its constructor).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow.fs as pafs
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.mlflow_settings import MLflowSettings
from ray_ormas._internal.common.scaling import elastic_range
from ray_ormas._internal.common.settings import BatchSize, MonitorSettings, check_strategy
from ray_ormas._internal.driver.monitor_options import monitor_settings
from ray_ormas._internal.driver.paths import resolve_location
from ray_ormas._internal.record.store import RecordStore, resolve
from ray_ormas._internal.tracking.values import check_run_exists, mlflow_host_idle_s
from ray_ormas._internal.worker.adoption import check_frameworks
from ray_ormas.errors import OptionError, OptionTypeError

logger = get_logger("ray_ormas.trainer")


@dataclass(frozen=True)
class CheckedArguments:
    """What the trainer runs with, every part checked."""

    strategy: str
    settings: MonitorSettings
    scaling_config: ScalingConfig
    elastic: tuple[int, int] | None  # an elastic fit's (min, max) workers
    world_size: int  # the workers (local mode: 1, the driver; elastic: the maximum)
    sync_batchnorm: bool
    batches: dict[int, dict[str, Any]] | None  # the batch's split at each world size the fit may run at
    run_config: RunConfig  # a local storage path made absolute
    store: RecordStore  # the record's storage, checked for writing
    mlflow: MLflowSettings | None  # None: not tracked
    fleet: FleetSettings | None  # None: fleet health off
    frameworks: tuple[str, ...]  # the frameworks zero-change mode attaches to


def check_arguments(
    train_loop_per_worker: Callable[..., Any],
    *,
    train_loop_config: dict[str, Any] | None,
    monitor: MonitorSettings | None,
    monitor_options: dict[str, Any],
    strategy: str,
    scaling_config: ScalingConfig | None,
    run_config: RunConfig | None,
    record_dir: str | os.PathLike | None,
    sync_batchnorm: bool,
    batch: BatchSize | None,
    mlflow: MLflowSettings | bool,
    fleet: FleetSettings | bool,
    torch_trainer_arguments: dict[str, Any],
) -> CheckedArguments:
    """Check and resolve the trainer's arguments (see the module docstring); the first problem
    found is raised."""
    check_loop(train_loop_per_worker)
    if train_loop_config is not None and not isinstance(train_loop_config, dict):
        raise OptionTypeError(f"train_loop_config must be a dict (or None), got {type(train_loop_config).__name__}")
    strategy = check_strategy(strategy)
    settings = monitor_settings(monitor, **monitor_options)
    scaling = scaling_config if scaling_config is not None else ScalingConfig(num_workers=1)
    if not isinstance(scaling, ScalingConfig):
        raise OptionTypeError(f"scaling_config must be a ray.train.ScalingConfig, got {type(scaling_config).__name__}")
    elastic = elastic_range(scaling.num_workers, "ScalingConfig(num_workers=...)")
    workers = _workers(elastic[1] if elastic is not None else scaling.num_workers)
    _check_strategy_fits(strategy, settings, workers)
    _check_sync_batchnorm(sync_batchnorm, strategy, scaling.use_gpu)
    if batch is not None and not isinstance(batch, BatchSize):
        raise OptionTypeError(
            f"batch must be a ray_ormas.BatchSize(size, per='rank'|'global', accumulation=1), "
            f"got {type(batch).__name__}"
        )
    world_size = max(workers, 1)
    batches = batch_splits(batch, world_size, elastic)  # refuses an uneven split
    run = run_config if run_config is not None else RunConfig()
    if not isinstance(run, RunConfig):
        raise OptionTypeError(f"run_config must be a ray.train.RunConfig, got {type(run_config).__name__}")
    run = with_absolute_storage_path(run)
    store = _record_store(run, record_dir)
    tracking = _mlflow_settings(mlflow, run)
    fleet_settings = _fleet_settings(fleet, world_size, scaling.use_gpu)
    _check_restarts(fleet_settings, run)
    frameworks = check_frameworks(train_loop_per_worker) if settings.auto_monitor else ()
    # Ray Train checks its own arguments when a TorchTrainer is built (and refuses some, e.g.
    # V2's DeprecationWarning for metadata and resume_from_checkpoint): build one now, on the
    # driver, so that its errors come before anything starts. fit() builds the one that runs.
    TorchTrainer(
        train_loop_per_worker,
        train_loop_config=train_loop_config,
        scaling_config=scaling,
        run_config=run,
        **torch_trainer_arguments,
    )
    return CheckedArguments(
        strategy=strategy,
        settings=settings,
        scaling_config=scaling,
        elastic=elastic,
        world_size=world_size,
        sync_batchnorm=sync_batchnorm,
        batches=batches,
        run_config=run,
        store=store,
        mlflow=tracking,
        fleet=fleet_settings,
        frameworks=frameworks,
    )


def local_run_dir(run_config: RunConfig) -> str | None:
    """The run's folder when its storage is local (home of the embedded MLflow store)."""
    fs, base = resolve(run_config.storage_path, run_config.storage_filesystem)
    return os.path.join(base, run_config.name) if isinstance(fs, pafs.LocalFileSystem) else None


def check_loop(fn: Any) -> None:
    """The loop is a function of no argument or one (the train_loop_config dict)."""
    if not callable(fn):
        raise OptionTypeError(f"train_loop_per_worker must be a function fn() or fn(config), got {type(fn).__name__}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) > 1 and len(required) > 1:
        raise OptionTypeError(
            f"train_loop_per_worker must take no argument or one (the train_loop_config dict); "
            f"{getattr(fn, '__name__', fn)} takes {[p.name for p in params]}"
        )


def batch_splits(
    batch: BatchSize | None, world_size: int, elastic: tuple[int, int] | None
) -> dict[int, dict[str, Any]] | None:
    """The batch at each world size the fit may run at: at the one size of a fixed fit, where an
    uneven global split is refused; at every size of an elastic range, by the rule of
    `BatchSize.elastic_splits` (docs/elastic.md), saying which sizes train on a smaller
    effective batch."""
    if batch is None:
        return None
    if elastic is None:
        return {world_size: batch.to_dict(world_size)}
    splits = batch.elastic_splits(*elastic, option="ScalingConfig(num_workers=...) (scaling.workers in a YAML config)")
    rounded = {w: s["effective"] for w, s in splits.items() if s.get("rounded")}
    if rounded:
        logger.warning(
            "a global batch of %d does not split evenly at %s: at those sizes each rank loads %s, so the "
            "optimizer step sees %s samples; each segment records its own split (docs/elastic.md)",
            batch.size,
            " or ".join(f"{w} workers" for w in rounded),
            " / ".join(str(splits[w]["per_rank"]) for w in rounded),
            " / ".join(str(e) for e in rounded.values()),
        )
    return splits


def with_absolute_storage_path(run_config: RunConfig) -> RunConfig:
    """The run config with a local storage path made absolute (driver/paths.py); a path on a
    filesystem the user gave (other than the local one) is left as it is."""
    fs = run_config.storage_filesystem
    if fs is not None and not isinstance(fs, pafs.LocalFileSystem):
        return run_config
    resolved = resolve_location(run_config.storage_path, "RunConfig(storage_path=...)")
    if resolved.note:
        logger.warning("%s", resolved.note)
    if resolved.location == run_config.storage_path:
        return run_config
    return dataclasses.replace(run_config, storage_path=resolved.location)


def _workers(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise OptionError(
            f"ScalingConfig.num_workers must be an int >= 1, or 0 for Ray Train's local mode (the "
            f"loop in this process, for debugging), got {workers!r}"
        )
    return workers


def _check_strategy_fits(strategy: str, settings: MonitorSettings, workers: int) -> None:
    if strategy == "fsdp" and workers == 0:
        raise OptionError(
            "strategy='fsdp' needs a process group, and Ray Train's local mode (num_workers=0) runs "
            "the loop in this process without one: debug with strategy='ddp' (one process, the model "
            "left unwrapped), or give num_workers >= 1"
        )
    if strategy == "fsdp" and settings.repair:
        raise OptionError(
            "repair is not possible with strategy='fsdp': FSDP shards the parameters, so whole "
            "filters can be neither read nor rewritten (ormas-monitor refuses it once the model "
            "is wrapped). Use repair=False: gradient alarms, loss checks and the record still "
            "work; or strategy='ddp' to repair"
        )


def _check_sync_batchnorm(sync_batchnorm: Any, strategy: str, use_gpu: bool) -> None:
    if not isinstance(sync_batchnorm, bool):
        raise OptionTypeError(f"sync_batchnorm must be True or False, got {sync_batchnorm!r}")
    if sync_batchnorm and strategy != "ddp":
        raise OptionError(
            "sync_batchnorm=True applies to strategy='ddp' (it converts BatchNorm layers before "
            "DDP wraps the model); with FSDP keep BatchNorm as it is or convert it yourself"
        )
    if sync_batchnorm and not use_gpu:
        raise OptionError(
            "sync_batchnorm=True needs GPU workers: torch refuses SyncBatchNorm on CPU "
            "('SyncBatchNorm layers only work with GPU modules'). Set ScalingConfig(use_gpu=True), "
            "or leave sync_batchnorm=False on CPU"
        )


def _record_store(run_config: RunConfig, record_dir: str | os.PathLike | None) -> RecordStore:
    """The record's storage (beside Ray's checkpoints unless `record_dir` says), checked for writing."""
    location: str | os.PathLike | None = record_dir
    if record_dir is not None:
        resolved = resolve_location(record_dir, "record_dir")
        if resolved.note:
            logger.warning("%s", resolved.note)
        location = resolved.location
    store = RecordStore.for_run(run_config, location)
    store.check_writable()
    return store


def _mlflow_settings(mlflow: Any, run_config: RunConfig) -> MLflowSettings | None:
    """The fit's MLflow settings, or None when it is not tracked; a run id to continue must exist."""
    if mlflow is True:
        mlflow = MLflowSettings()
    if mlflow is not False and not isinstance(mlflow, MLflowSettings):
        raise OptionTypeError(f"mlflow must be True, False or a ray_ormas.MLflowSettings, got {type(mlflow).__name__}")
    settings = mlflow if mlflow and mlflow.enabled else None
    if settings is not None:
        mlflow_host_idle_s()  # a bad RAY_ORMAS_MLFLOW_HOST_IDLE_S is an OptionError here, not on the head node
    if settings is not None and settings.run_id is not None:
        check_run_exists(settings, local_run_dir(run_config))
    return settings


def _check_restarts(fleet: FleetSettings | None, run: RunConfig) -> None:
    """A `reattempt` or `evict` action restarts the group through Ray's failure policy, which needs room."""
    if fleet is None:
        return
    restarting = sorted(kind for kind, chain in fleet.actions.items() if chain[-1] in ("reattempt", "evict"))
    failures = run.failure_config.max_failures if run.failure_config is not None else 0
    if fleet.policy is not None and failures == 0 and not restarting:
        logger.warning(
            "FleetSettings.policy may ask to restart the worker group, and with "
            "FailureConfig(max_failures=0) a restart ends the fit instead: give max_failures >= 1 if it may"
        )
    if restarting and failures == 0:
        raise OptionError(
            f"FleetSettings.actions restarts the worker group on {', '.join(restarting)} alarms, and a "
            f"restart is a failure to Ray: give RunConfig(failure_config=FailureConfig(max_failures=N)) "
            f"with N >= 1 (or -1), or use 'log' or 'stop'"
        )


def _fleet_settings(fleet: Any, workers: int, use_gpu: bool) -> FleetSettings | None:
    """The fit's fleet settings, or None when fleet health is off."""
    if fleet is True:
        fleet = FleetSettings() if workers > 1 else None
    elif isinstance(fleet, FleetSettings) and not fleet.enabled and fleet.acts:
        raise OptionError(
            "FleetSettings.actions acts on fleet alarms, and enabled=False turns fleet health off: "
            "remove the actions, or leave fleet health on"
        )
    elif fleet is False or isinstance(fleet, FleetSettings) and not fleet.enabled:
        return None
    elif not isinstance(fleet, FleetSettings):
        raise OptionTypeError(f"fleet must be True, False or a ray_ormas.FleetSettings, got {type(fleet).__name__}")
    elif workers == 1 and fleet.acts:
        raise OptionError(
            "FleetSettings.actions acts on fleet alarms, which compare the ranks with each other: with "
            "one worker there are none. Use ScalingConfig(num_workers=2) or more, or remove the actions"
        )
    elif workers == 1:
        logger.warning(
            "fleet health compares the ranks with each other; with one worker there is "
            "nothing to compare, so it is off (the monitor still records rank 0's non-finite values)"
        )
        return None
    if fleet is not None and fleet.nccl_hang_detector != "off" and not use_gpu:
        raise OptionError(
            f"fleet nccl_hang_detector={fleet.nccl_hang_detector!r} watches NCCL communicators, which "
            f"only GPU workers have: set ScalingConfig(use_gpu=True), or leave it 'off' on CPU (gloo)"
        )
    return fleet
