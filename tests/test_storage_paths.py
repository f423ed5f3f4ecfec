"""Storage locations resolved on the driver (paths.py), clusters that cannot place the workers
(capacity.py), and the one-paragraph root cause of a failed fit (failures.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from ray.exceptions import RayTaskError
from ray.train import ControllerError, RunConfig, ScalingConfig, WorkerGroupError

from ray_ormas import RayOrmasTrainer
from ray_ormas._internal.driver.capacity import check_capacity, per_worker
from ray_ormas._internal.driver.failures import describe_failure
from ray_ormas._internal.driver.paths import StoragePathError, resolve_location
from ray_ormas._internal.seams.ray_train import JOB_CONFIG_ENV as RAY_JOB_ENV

from .conftest import ROOT

A_SUBMITTED_JOB = json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip"}, "metadata": {}})


def test_a_relative_path_is_made_absolute_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    resolved = resolve_location("runs/exp", "storage.path")
    assert resolved.location == str(tmp_path / "runs" / "exp")
    assert "relative" in resolved.note and str(tmp_path / "runs" / "exp") in resolved.note
    home = resolve_location("~", "storage.path")
    assert home.location == os.path.expanduser("~") and home.note
    assert resolve_location(str(tmp_path), "k") == resolve_location(str(tmp_path), "k")
    assert resolve_location(str(tmp_path), "k").note is None
    assert resolve_location("s3://bucket/runs", "k").location == "s3://bucket/runs"


@pytest.mark.parametrize(
    "value, words",
    [
        ("", ["storage.path is empty"]),
        ("ftp2://host/runs", ["'ftp2://host/runs' has the scheme 'ftp2'", "s3://"]),
        ("/no/such/parent/runs", ["its parent folder /no/such/parent does not exist", "mkdir -p /no/such/parent"]),
    ],
)
def test_bad_locations_are_refused_naming_the_key(value, words):
    with pytest.raises(StoragePathError) as e:
        resolve_location(value, "storage.path")
    assert str(e.value).startswith("storage.path")
    for w in words:
        assert w in str(e.value)


def test_a_file_is_not_a_storage_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoragePathError, match="is a file, not a folder"):
        resolve_location(str(tmp_path / "f"), "record_dir")


def test_under_ray_job_submit_a_relative_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RAY_JOB_ENV, A_SUBMITTED_JOB)
    with pytest.raises(StoragePathError) as e:
        resolve_location("runs", "storage.path")
    assert "ray job submit" in str(e.value) and "temporary copy of --working-dir" in str(e.value)
    assert "~/ray_ormas_runs" in str(e.value)
    assert resolve_location("~/runs", "storage.path").location == os.path.expanduser("~/runs")
    with pytest.raises(StoragePathError):
        RayOrmasTrainer(lambda: None, run_config=RunConfig(name="r", storage_path="runs"))


def test_the_trainer_hands_ray_an_absolute_storage_path_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ray_ormas.trainer"):
        trainer = RayOrmasTrainer(
            lambda: None, run_config=RunConfig(name="r", storage_path="runs"), record_dir="records", mlflow=False
        )
    assert trainer.run_config.storage_path == str(tmp_path / "runs")
    assert trainer.store.root == str(tmp_path / "records")
    notes = [r.getMessage() for r in caplog.records]
    assert any("RunConfig(storage_path=...) 'runs' is relative" in n for n in notes), notes
    assert any("record_dir 'records' is relative" in n for n in notes), notes
    with pytest.raises(StoragePathError, match="RunConfig\\(storage_path=...\\)"):
        RayOrmasTrainer(lambda: None, run_config=RunConfig(name="r", storage_path="/no/such/parent/runs"))


def test_the_cli_says_where_a_relative_storage_path_goes(tmp_path, capsys, caplog, monkeypatch):
    from ray_ormas._internal.cli import main as cli

    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.INFO, logger="ray_ormas")
    code = cli.main(["train", "examples/digits_watch.yaml", "--dry-run", "--set", "storage.path=./tmp-runs-dry"])
    out = capsys.readouterr().out
    assert code == 0
    said = [r.getMessage() for r in caplog.records if r.name == "ray_ormas.train_command"]
    assert (
        f"[ray-ormas] storage.path './tmp-runs-dry' is relative to this directory: the run goes to "
        f"{ROOT / 'tmp-runs-dry'}" in said
    )
    assert f"path: {ROOT / 'tmp-runs-dry'}" in out and not (ROOT / "tmp-runs-dry").exists()


def test_capacity_per_node_and_in_total(ray_cluster):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    assert check_capacity(ScalingConfig(num_workers=2)) is None
    too_many = check_capacity(ScalingConfig(num_workers=int(cpus) + 1))
    assert too_many.startswith("ScalingConfig(num_workers=...)") and f"room for {int(cpus)}" in too_many
    too_big = check_capacity(
        ScalingConfig(num_workers=1, resources_per_worker={"CPU": cpus * 8}),
        keys={"resources": "scaling.resources_per_worker"},
    )
    assert too_big.startswith("scaling.resources_per_worker: one worker needs") and "no node" in too_big
    assert "GPU" in check_capacity(ScalingConfig(num_workers=1, use_gpu=True))
    assert per_worker(ScalingConfig(num_workers=1, use_gpu=True)) == {"GPU": 1.0}
    assert per_worker(ScalingConfig(num_workers=1, resources_per_worker={"CPU": 2, "GPU": 0})) == {"CPU": 2.0}


@pytest.mark.system  # the command starts a Ray cluster of its own
@pytest.mark.timeout(180)
def test_the_cli_refuses_workers_or_an_evict_a_cluster_it_started_cannot_serve(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_ormas",
            "train",
            str(ROOT / "examples" / "digits_repair.yaml"),
            "--set",
            "scaling.resources_per_worker={CPU: 64}",
            "--set",
            "fleet.actions={straggler: evict}",
            "--set",
            "failure.max_failures=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "scaling.resources_per_worker: one worker needs 64 CPU" in done.stderr
    # ... and, in the same message, an evict that could never act: the one node is the head node.
    assert "fleet.actions evicts on straggler alarms, and this Ray cluster has one node" in done.stderr
    assert "cannot grow" in done.stderr and not (tmp_path / "ray_ormas_runs" / "digits-repair").exists()


def test_the_root_cause_in_one_paragraph():
    both = WorkerGroupError("Training failed", {0: RuntimeError("boom"), 1: RuntimeError("boom")})
    assert describe_failure(both) == "on ranks 0, 1: RuntimeError: boom"
    one = WorkerGroupError("Training failed", {1: ValueError("bad shape\nsecond line")})
    assert describe_failure(one) == "on rank 1: ValueError: bad shape second line"
    remote = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
        "pyarrow.lib.ArrowInvalid: URI has empty scheme: './runs'"
    )
    assert (
        describe_failure(ControllerError(RuntimeError(remote)))
        == "pyarrow.lib.ArrowInvalid: URI has empty scheme: './runs'"
    )
    try:
        raise KeyError("k")
    except KeyError as inner:
        task = RayTaskError("f", "Traceback ...", inner)
    assert describe_failure(ControllerError(task)) == "KeyError: 'k'"
    try:
        try:
            raise OSError("disk full")
        except OSError as e:
            raise RuntimeError("could not save") from e
    except RuntimeError as outer:
        assert describe_failure(outer) == "OSError: disk full"
