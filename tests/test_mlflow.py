"""MLflow tracking against a real `mlflow server` (SQLite backend) started here on 127.0.0.1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError

from ray_ormas import MLflowSettings, RayOrmasTrainer

from .loops import digits_loop
from .mlflow_server import mlflow_server

RECORD_FILES = {"diary.jsonl", "metrics.jsonl", "report.html", "segment.json", "summary.html", "summary.md"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as (uri, _):
        yield uri


def fit(storage: Path, name: str, settings: MLflowSettings, workers: int = 2, **kwargs):
    run_config = kwargs.pop("run_config", RunConfig(name=name, storage_path=str(storage)))
    return RayOrmasTrainer(digits_loop, check_every=4, verbose=False, mlflow=settings,
                           scaling_config=ScalingConfig(num_workers=workers), run_config=run_config, **kwargs).fit()


def runs_of(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def artifacts(client: MlflowClient, run_id: str, path: str) -> set[str]:
    return {Path(f.path).name for f in client.list_artifacts(run_id, path)}


def diary(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "diary.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_one_complete_run_per_fit(ray_cluster, server, storage, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "s3cr3t-t0ken")
    config = {"steps": 16, "report_at": [8], "checkpoint": True,
              "opt": {"betas": [0.9, 0.99], "sched": {"warmup": 3}}, "long": "x" * 7000, "api": "s3cr3t-t0ken"}
    result = fit(storage, "tracked", MLflowSettings(tracking_uri=server, experiment_name="one-run",
                                                    tags={"team": "vision"}), train_loop_config=config)
    [run] = runs_of(server, "one-run")
    client = MlflowClient(server)
    assert result.ormas.mlflow_run_id == run.info.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "tracked" and run.data.tags["team"] == "vision"
    p = run.data.params
    assert p["train_loop_config.opt.sched.warmup"] == "3" and p["train_loop_config.opt.betas"] == "[0.9, 0.99]"
    assert p["monitor.config.check_every"] == "4" and p["monitor.repair"] == "False"
    assert p["strategy"] == "ddp" and p["scaling.num_workers"] == "2"
    assert len(p["train_loop_config.long"]) == 6000 and p["train_loop_config.long"].endswith("...")
    assert "train_loop_config.long" in run.data.tags["ray_ormas.truncated_params"]
    assert p["train_loop_config.api"] == "***"                       # the env's secret never lands
    losses = client.get_metric_history(run.info.run_id, "ormas/loss")
    assert [m.step for m in losses] == [0, 4, 8, 12]                 # one row per check, at its step
    assert len(client.get_metric_history(run.info.run_id, "ormas/grad_norm/conv2.0")) == 4
    assert client.get_metric_history(run.info.run_id, "ormas/events/manifest")[0].step == 0
    assert artifacts(client, run.info.run_id, "ormas/model/segment-000") == RECORD_FILES
    assert run.data.tags["ray_ormas.final_checkpoint"] == result.checkpoint.path
    out = capsys.readouterr()
    record = "".join((result.ormas.record_dir / f).read_text() for f in ("diary.jsonl", "metrics.jsonl"))
    assert "s3cr3t-t0ken" not in out.out + out.err + record + json.dumps(run.data.tags)


@pytest.mark.timeout(300)
def test_failure_is_failed_with_the_error_and_a_restart_stays_one_run(ray_cluster, server, storage, tmp_path):
    settings = MLflowSettings(tracking_uri=server, experiment_name="failures")
    with pytest.raises(TrainingFailedError):
        fit(storage, "boom", settings, train_loop_config={"steps": 10, "raise_at": 5})
    restarted = fit(storage, "restart", settings,
                    train_loop_config={"steps": 12, "fail_once_marker": str(tmp_path / "once")},
                    run_config=RunConfig(name="restart", storage_path=str(storage),
                                         failure_config=FailureConfig(max_failures=1)))
    runs = {r.info.run_name: r for r in runs_of(server, "failures")}
    assert set(runs) == {"boom", "restart"}                         # one run per fit, restart included
    assert runs["boom"].info.status == "FAILED"
    assert "boom at step 5" in runs["boom"].data.tags["ray_ormas.error"]
    assert runs["restart"].info.status == "FINISHED"
    assert runs["restart"].info.run_id == restarted.ormas.mlflow_run_id
    client = MlflowClient(server)
    assert artifacts(client, runs["restart"].info.run_id, "ormas/model") == {"segment-000", "segment-001"}
    assert artifacts(client, runs["boom"].info.run_id, "ormas/model/segment-000") == RECORD_FILES


@pytest.mark.timeout(240)
def test_an_existing_run_id_is_continued(ray_cluster, server, storage):
    client = MlflowClient(server)
    exp = client.create_experiment("continued")
    run_id = client.create_run(exp, run_name="mine").info.run_id
    result = fit(storage, "continued", MLflowSettings(tracking_uri=server, run_id=run_id),
                 train_loop_config={"steps": 8})
    assert result.ormas.mlflow_run_id == run_id
    [run] = runs_of(server, "continued")
    assert run.info.status == "FINISHED" and run.data.metrics["ormas/loss"] > 0


@pytest.mark.timeout(240)
def test_tracker_down_at_start_trains_on_with_one_warning_and_a_sink_error(ray_cluster, storage, capsys):
    from .mlflow_server import free_port
    dead = f"http://127.0.0.1:{free_port()}"
    t = time.time()
    result = fit(storage, "nodb", MLflowSettings(tracking_uri=dead, request_timeout_s=2),
                 train_loop_config={"steps": 8})
    assert time.time() - t < 120
    assert result.ormas.mlflow_run_id is None
    errors = [e for e in diary(result.ormas.record_dir) if e["event"] == "sink_error"]
    assert len(errors) == 1 and "MLflow tracking was unavailable" in errors[0]["error"]
    assert diary(result.ormas.record_dir)[-1]["event"] == "run_end"
    assert capsys.readouterr().err.count("MLflow tracking at") == 1


@pytest.mark.timeout(300)
def test_tracker_killed_mid_training_loses_nothing_on_disk(ray_cluster, storage, tmp_path):
    with mlflow_server(tmp_path / "doomed") as (uri, proc):
        result = fit(storage, "doomed", MLflowSettings(tracking_uri=uri, experiment_name="doomed",
                                                       request_timeout_s=2),
                     train_loop_config={"steps": 24, "kill_server_at": 10, "server_pgid": proc.pid})
    record = result.ormas.record_dir
    errors = [e for e in diary(record) if e["event"] == "sink_error"]
    assert len(errors) == 1 and "TrackingSink" in errors[0]["sink"]
    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 8, 12, 16, 20]         # every check is on disk
    assert diary(record)[-1]["event"] == "run_end"


def test_bad_mlflow_settings_fail_on_the_driver():
    with pytest.raises(ValueError, match="must not carry credentials"):
        MLflowSettings(tracking_uri="https://bob:hunter2@mlflow.example.com")
    with pytest.raises(ValueError, match="tags must map strings to strings"):
        MLflowSettings(tags={"n": 3})
    with pytest.raises(TypeError, match="mlflow must be True, False or a ray_ormas.MLflowSettings"):
        RayOrmasTrainer(digits_loop, mlflow="http://x")


INTERRUPTED_DRIVER = textwrap.dedent("""
    import sys, ray
    from ray.train import RunConfig, ScalingConfig
    sys.path.insert(0, {root!r})
    from ray_ormas import MLflowSettings, RayOrmasTrainer
    from tests.loops import digits_loop
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    RayOrmasTrainer(digits_loop, train_loop_config={{"steps": 10000, "sleep_per_step": 0.05}}, check_every=2,
                    verbose=False, mlflow=MLflowSettings(tracking_uri={uri!r}, experiment_name="interrupted"),
                    scaling_config=ScalingConfig(num_workers=1),
                    run_config=RunConfig(name="interrupted", storage_path={storage!r})).fit()
""")


@pytest.mark.timeout(300)
def test_ctrl_c_on_the_driver_ends_the_run_as_killed(server, storage):
    root = str(Path(__file__).resolve().parent.parent)
    script = INTERRUPTED_DRIVER.format(root=root, uri=server, storage=str(storage))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not any(r.data.metrics for r in runs_of(server, "interrupted")):
            assert proc.poll() is None and time.time() < deadline, "the driver never started logging"
            time.sleep(1)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    [run] = runs_of(server, "interrupted")
    assert run.info.status == "KILLED"


def test_params_are_flattened_truncated_and_scrubbed(monkeypatch):
    from ray_ormas.tracking import fit_params, flatten_params, shown
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter22")
    flat = flatten_params({"a": {"b": {"c": 1}, "empty": {}}, "l": [1, 2], "pw": "x-hunter22-y", "k" * 300: "v"})
    assert flat["a.b.c"] == "1" and flat["a.empty"] == "{}" and flat["l"] == "[1, 2]"
    values, cut = fit_params(flat)
    assert values["pw"] == "x-***-y" and "k" * 250 in values and cut == ["k" * 300]
    assert shown("https://bob:pw@host:5000/x") == "https://***@host:5000/x"


def test_a_relative_sqlite_store_works_from_the_driver(tmp_path, monkeypatch):
    from ray_ormas.tracking import RunTracker
    monkeypatch.chdir(tmp_path)
    tracker = RunTracker.start(MLflowSettings(tracking_uri="sqlite:///rel.db"), None, "rel", {"x": {"y": 1}})
    assert tracker.run_id is not None
    tracker.end("FINISHED")
    run = MlflowClient("sqlite:///rel.db").get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"x.y": "1"}
    assert run.info.artifact_uri.startswith((tmp_path / "artifacts").as_uri())


def test_a_missing_run_id_fails_on_the_driver_and_a_continued_run_keeps_its_params(tmp_path, monkeypatch):
    from ray_ormas.tracking import RunTracker
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        RunTracker.start(MLflowSettings(tracking_uri="sqlite:///c.db", run_id="0" * 32), None, "c", {})
    first = RunTracker.start(MLflowSettings(tracking_uri="sqlite:///c.db"), None, "c", {"lr": 0.1, "seed": 1})
    first.end("FAILED")
    again = RunTracker.start(MLflowSettings(tracking_uri="sqlite:///c.db", run_id=first.run_id), None, "c",
                             {"lr": 0.2, "seed": 1, "epochs": 3})
    assert again.run_id == first.run_id
    again.end("FINISHED")
    run = MlflowClient("sqlite:///c.db").get_run(first.run_id)
    assert run.data.params == {"lr": "0.1", "seed": "1", "epochs": "3"}
    assert run.data.tags["ray_ormas.changed_params"] == "lr" and run.info.status == "FINISHED"
