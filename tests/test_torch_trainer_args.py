"""Every `TorchTrainer` argument reaches Ray Train through `RayOrmasTrainer`; Ray Train's local
mode (`num_workers=0`) runs the loop in this process with the monitor; elastic ranges are
refused on the driver with the reason. On the test session's real Ray cluster."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_ormas import RayOrmasTrainer

from . import loops


def test_the_trainer_takes_every_torch_trainer_argument():
    ours = inspect.signature(RayOrmasTrainer.__init__).parameters
    theirs = inspect.signature(TorchTrainer.__init__).parameters
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    for name, parameter in theirs.items():
        if name != "self":
            assert ours[name].kind == parameter.kind and ours[name].default == parameter.default, name


@pytest.mark.timeout(300)
def test_the_dataset_config_and_the_validation_config_reach_the_workers(worker_view_fit):
    # 8 rows given, unsplit by DataConfig(datasets_to_split=[]); a ValidationConfig (tests/shared_fits.py)
    result = worker_view_fit.result
    assert result.return_value["rows"] == 8
    [(checkpoint, metrics)] = result.best_checkpoints
    assert metrics["validated_params"] == 10.0 and "ormas" in checkpoint.get_metadata()
    assert verify_run(result.ormas.record_dir).ok


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_local_mode_runs_the_loop_in_this_process_with_the_monitor(storage):
    result = RayOrmasTrainer(
        loops.local_mode_loop,
        train_loop_config={"steps": 30},
        check_every=5,
        verbose=False,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="local", storage_path=str(storage)),
    ).fit()
    assert result.return_value == {"pid": os.getpid(), "world_size": 1}
    run = result.ormas
    assert verify_run(run.record_dir).ok and run.final["ormas/run_step"] == 30
    assert run.final["ormas/stuck_channels"] > 0  # the lesion is seen in this process
    assert [r[0]["ormas/kind"] for r in run.reports] == ["user", "final"]
    client = MlflowClient(tracking_uri=run.tracking_uri)
    assert run.mlflow_complete and client.get_run(run.mlflow_run_id).info.status == "FINISHED"
    assert client.get_metric_history(run.mlflow_run_id, "last_loss")
    assert client.get_metric_history(run.mlflow_run_id, "ormas/loss")


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_local_mode_raises_the_loops_own_error_and_keeps_the_record(storage):
    with pytest.raises(ValueError, match="the loop failed on purpose at step 12"):
        RayOrmasTrainer(
            loops.local_mode_loop,
            train_loop_config={"steps": 30, "raise_at": 12},
            check_every=5,
            verbose=False,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="local-fails", storage_path=str(storage)),
        ).fit()
    [segment] = (storage / "local-fails" / "ormas" / "model").glob("segment-*")
    assert verify_run(segment).ok
    client = MlflowClient(tracking_uri=f"sqlite:///{storage / 'local-fails' / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs(client.search_experiments()[0].experiment_id)
    assert run.info.status == "FAILED"


@pytest.mark.timeout(120)
def test_what_ray_train_refuses_is_refused_when_the_trainer_is_built_before_ray_starts(tmp_path):
    """metadata and resume_from_checkpoint reach TorchTrainer, which Ray Train V2 refuses with its
    own DeprecationWarning: raised by RayOrmasTrainer(...), in a fresh process, with no Ray started."""
    code = f"""
import ray, ray_ormas
from ray.train import Checkpoint
def loop():
    pass
start = Checkpoint.from_directory({str(tmp_path)!r})
for kwargs in ({{"metadata": {{"team": "vision"}}}}, {{"resume_from_checkpoint": start}}):
    try:
        ray_ormas.RayOrmasTrainer(loop, **kwargs)
    except DeprecationWarning as e:
        print("refused:", list(kwargs), str(e).split(".")[0])
print("ray initialized:", ray.is_initialized())
"""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("refused: ['metadata'] `get_metadata` was an experimental API")
    assert lines[1].startswith("refused: ['resume_from_checkpoint'] `resume_from_checkpoint` is deprecated")
    assert lines[2] == "ray initialized: False"


def test_local_mode_with_fsdp_is_refused_on_the_driver():
    with pytest.raises(ValueError, match=r"strategy='fsdp' needs a process group.*local mode \(num_workers=0\)"):
        RayOrmasTrainer(loops.local_mode_loop, strategy="fsdp", scaling_config=ScalingConfig(num_workers=0))
