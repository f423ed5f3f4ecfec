"""`ray-ormas train CONFIG.yaml`: config -> RayOrmasTrainer -> fit -> summary, with exit codes.

    0  trained; the summary says where the record, its report and the MLflow run are
    1  training failed (the error, and where the failed run's record is, are printed)
    2  the config or one of its values is wrong, or the storage is unusable: nothing was started

Everything the driver can check is checked before Ray starts: the schema (job_config.py), the
imports of `module:function` targets, then everything `RayOrmasTrainer(...)` checks (batch split,
repair with FSDP, SyncBatchNorm without GPUs, writable storage). Then Ray: a local cluster when
none is running (the current directory goes on the workers' PYTHONPATH, so `module:function`
targets import there too), or the running cluster (under `ray job submit`, whose
`--working-dir` does the same for the workers). Long waits say what they wait for.

Hooks relied on: `ray.init` (RAY_ADDRESS), `ray.cluster_resources`, and the public API of
ray-ormas.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from .config import BatchSize
from .job_config import ConfigError, JobConfig, load_config, load_target
from .storage import RecordStorageError
from .tracking import MLflowSettings


def say(message: str) -> None:
    print(f"[ray-ormas] {message}", flush=True)


def train(path: str, overrides: list[str], *, dry_run: bool = False) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())          # `module:function` targets import like `python -m`
    try:
        job = load_config(path, overrides)
        trainer = build_trainer(job)
    except ConfigError as e:
        print(f"ray-ormas train: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, RecordStorageError) as e:
        print(f"ray-ormas train: {path}: {e}", file=sys.stderr)
        return 2
    if dry_run:
        import yaml
        print(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False), end="")
        say("config is valid; --dry-run started nothing")
        return 0
    _start_ray(job)
    say(f"training {job.name!r}: {job.scaling.workers} worker(s), strategy {job.strategy}, "
        f"{job.train.epochs} epoch(s); waiting for Ray Train to start the workers ...")
    started = time.monotonic()
    try:
        result = trainer.fit()
    except KeyboardInterrupt:
        print("ray-ormas train: interrupted", file=sys.stderr)
        return 1
    except BaseException as e:              # Ray's own errors, and the loop's, end the run: exit 1
        if isinstance(e, SystemExit) and e.code in (0, None):
            raise
        print(f"ray-ormas train: training failed after {time.monotonic() - started:.0f} s: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    from .summary import render
    run = result.ormas
    mlflow = f"run {run.mlflow_run_id} at {run.tracking_uri}" if run.mlflow_run_id else None
    say(f"finished in {time.monotonic() - started:.0f} s; final metrics: "
        f"{ {k: v for k, v in (result.metrics or {}).items() if not k.startswith('ormas/')} }")
    print(render(run.store, run.records, mlflow), flush=True)
    return 0


def build_trainer(job: JobConfig) -> Any:
    """The `RayOrmasTrainer` a config describes (its own checks run here, on the driver)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from .job_loop import supervised_loop
    from .trainer import RayOrmasTrainer

    m = job.monitor
    loop = load_target(job.loop.target) if job.loop is not None else supervised_loop
    mlflow: MLflowSettings | bool = False
    if job.mlflow.enabled:
        mlflow = MLflowSettings(tracking_uri=job.mlflow.tracking_uri, experiment_name=job.mlflow.experiment,
                                run_name=job.mlflow.run_name, tags=dict(job.mlflow.tags))
    return RayOrmasTrainer(
        loop, train_loop_config=job.model_dump(mode="json"), repair=m.repair, monitor_config=m.monitor_config(),
        layers=m.layers, verbose=m.verbose, progress=m.progress, report_every=m.report_every,
        sync_timeout_s=m.sync_timeout_s, record_dir=job.storage.record_dir, strategy=job.strategy,
        sync_batchnorm=job.sync_batchnorm, batch=BatchSize(**job.train.batch.model_dump()), mlflow=mlflow,
        scaling_config=ScalingConfig(num_workers=job.scaling.workers, use_gpu=job.scaling.use_gpu,
                                     resources_per_worker=dict(job.scaling.resources_per_worker) or None),
        run_config=RunConfig(name=job.name, storage_path=job.storage.path,
                             failure_config=FailureConfig(max_failures=job.failure.max_failures,
                                                          controller_failure_limit=job.failure.controller_failure_limit),
                             checkpoint_config=CheckpointConfig(num_to_keep=job.train.keep_checkpoints)))


def _start_ray(job: JobConfig) -> None:
    import ray
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        say(f"connecting to the Ray cluster at {address} ...")
        ray.init(log_to_driver=True)
    else:
        say("no RAY_ADDRESS: starting a local Ray cluster (or joining one started with `ray start` here) ...")
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}})
    have = ray.cluster_resources()
    need_cpu = job.scaling.workers * float(job.scaling.resources_per_worker.get("CPU", 1))
    need_gpu = job.scaling.workers * float(job.scaling.resources_per_worker.get("GPU", 1 if job.scaling.use_gpu else 0))
    say(f"Ray is up: {have.get('CPU', 0):g} CPUs, {have.get('GPU', 0):g} GPUs in the cluster; the workers need "
        f"{need_cpu:g} CPUs, {need_gpu:g} GPUs")
    if have.get("CPU", 0) < need_cpu or have.get("GPU", 0) < need_gpu:
        say("the cluster is smaller than the workers need: Ray Train waits for it to grow (an autoscaler) and "
            "gives up after RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S per try (failure.controller_failure_limit "
            "tries); lower scaling.workers or resources_per_worker to run now")
