"""MLflow tracking against a real `mlflow server` (SQLite backend) started here on 127.0.0.1.

The ground truth is the record: after every scenario (a worker killed, the server killed and
started again, a server down for the whole fit then `ray-ormas mlflow-sync`, workers that cannot
reach the server), MLflow's metric histories must equal the record's rows at their run steps.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import ray
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import FailureConfig, RunConfig, ScalingConfig

from ray_ormas import MLflowSettings, RayOrmasTrainer

from .loops import digits_loop, resume_loop
from .mlflow_server import MLflowServer, mlflow_server
from .shared_fits import SECRET

RAY_ORMAS = str(Path(sys.executable).with_name("ray-ormas"))

RECORD_FILES = {"diary.jsonl", "metrics.jsonl", "report.html", "segment.json", "summary.html", "summary.md"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as (uri, _):
        yield uri


def fit(storage: Path, name: str, settings: MLflowSettings, workers: int = 2, **kwargs):
    run_config = kwargs.pop("run_config", RunConfig(name=name, storage_path=str(storage)))
    return RayOrmasTrainer(
        digits_loop,
        check_every=4,
        verbose=False,
        mlflow=settings,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=run_config,
        **kwargs,
    ).fit()


def runs_of(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def artifacts(client: MlflowClient, run_id: str, path: str) -> set[str]:
    return {Path(f.path).name for f in client.list_artifacts(run_id, path)}


def diary(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "diary.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_one_complete_run_per_fit(healthy_fit):
    # The shared healthy fit (tests/shared_fits.py), tracked in the embedded store as by default:
    # the writer is the same for every store (the server's runs are checked below).
    result, printed = healthy_fit.result, healthy_fit.printed
    uri = f"sqlite:///{healthy_fit.run_dir / 'mlflow' / 'mlflow.db'}"
    [run] = runs_of(uri, "one-run")
    client = MlflowClient(uri)
    assert result.ormas.mlflow_run_id == run.info.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "healthy" and run.data.tags["team"] == "vision"
    p = run.data.params
    assert p["train_loop_config.opt.sched.warmup"] == "3" and p["train_loop_config.opt.betas"] == "[0.9, 0.99]"
    assert p["monitor.config.check_every"] == "4" and p["monitor.repair"] == "False"
    assert p["strategy"] == "ddp" and p["scaling.num_workers"] == "2"
    assert len(p["train_loop_config.long"]) == 6000 and p["train_loop_config.long"].endswith("...")
    assert "train_loop_config.long" in run.data.tags["ray_ormas.truncated_params"]
    assert p["train_loop_config.api"] == "***"  # the env's secret never lands
    losses = client.get_metric_history(run.info.run_id, "ormas/loss")
    assert [m.step for m in losses] == [0, 4, 8, 12, 16, 20]  # one row per check, at its step
    assert len(client.get_metric_history(run.info.run_id, "ormas/grad_norm/conv2.0")) == 6
    assert client.get_metric_history(run.info.run_id, "ormas/events/manifest")[0].step == 0
    # The pre-flight screen: its seconds and the ranks it named, at the attempt's number.
    [screened] = client.get_metric_history(run.info.run_id, "fleet/preflight/seconds")
    [named] = client.get_metric_history(run.info.run_id, "fleet/preflight/named")
    assert (screened.step, named.step, named.value) == (0, 0, 0.0) and 0 < screened.value < 5
    assert artifacts(client, run.info.run_id, "ormas/model/segment-000") == RECORD_FILES
    assert run.data.tags["ray_ormas.final_checkpoint"] == result.checkpoint.path
    record = "".join((result.ormas.record_dir / f).read_text() for f in ("diary.jsonl", "metrics.jsonl"))
    assert SECRET not in printed + record + json.dumps(run.data.tags)


def test_a_failed_fit_is_failed_with_the_error(failed_fit):
    # The shared failing fit (tests/shared_fits.py), tracked in the embedded store as by default:
    # the writer that closes a run FAILED is the same for every store.
    uri = f"sqlite:///{failed_fit.run_dir / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(uri)
    [run] = runs_of(uri, "ray-ormas")
    assert run.info.status == "FAILED"
    assert "boom at step 7" in run.data.tags["ray_ormas.error"]
    assert artifacts(client, run.info.run_id, "ormas/model/segment-000") == RECORD_FILES


@pytest.fixture(scope="module")
def restarted(ray_cluster, server, tmp_path_factory):
    """A fit whose rank 0 fails once at step 5, restarted by Ray (max_failures=1), tracked on the server."""
    storage = tmp_path_factory.mktemp("restart")
    result = fit(
        storage,
        "restart",
        MLflowSettings(tracking_uri=server, experiment_name="failures"),
        report_every=2,
        train_loop_config={"steps": 12, "fail_once_marker": str(tmp_path_factory.mktemp("marker") / "once")},
        run_config=RunConfig(name="restart", storage_path=str(storage), failure_config=FailureConfig(max_failures=1)),
    )
    return result, storage


@pytest.mark.timeout(300)
def test_a_restart_stays_one_run(restarted, server):
    restarted, _ = restarted
    runs = {r.info.run_name: r for r in runs_of(server, "failures")}
    assert set(runs) == {"restart"}  # one run per fit, restart included
    assert runs["restart"].info.status == "FINISHED"
    assert runs["restart"].info.run_id == restarted.ormas.mlflow_run_id
    client = MlflowClient(server)
    assert artifacts(client, runs["restart"].info.run_id, "ormas/model") == {"segment-000", "segment-001"}


@pytest.mark.timeout(300)
def test_a_restarted_worker_group_records_a_new_segment_beside_the_failed_one(restarted):
    result, storage = restarted
    root = storage / "restart" / "ormas" / "model"
    failed, retried = root / "segment-000", root / "segment-001"
    assert result.ormas.record_dir == retried
    assert diary(failed)[-1]["error"] == "RuntimeError: injected failure" and diary(failed)[-1]["steps"] == 5
    assert "error" not in diary(retried)[-1] and diary(retried)[-1]["steps"] == 12
    assert verify_run(failed).ok and verify_run(retried).ok
    assert result.ormas.worker_errors == [{0: "RuntimeError: injected failure"}]
    assert result.ormas.final["ormas/kind"] == "final" and result.ormas.final["ormas/steps_per_rank"] == [12, 12]


def test_the_fits_of_one_job_share_the_jobs_mlflow_host(restarted, isolated):
    # Both fits track on the server with the same request timeout and environment: one host
    # process held both writers (head/mlflow_host.py), so the second imported nothing of MLflow.
    from ray_ormas._internal.head.mlflow_host import NAMESPACE

    served = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == NAMESPACE:
            try:
                served.append(ray.get(ray.get_actor(actor["name"], namespace=NAMESPACE).served.remote(), timeout=60))
            except (ValueError, ray.exceptions.RayActorError):  # a host that ended since the listing
                pass
    assert any(s["served"] >= 2 for s in served), served


@pytest.fixture(scope="module")
def isolated(ray_cluster, server, tmp_path_factory):
    """One fit that continues a run created beforehand (its run id), whose workers cannot reach the
    server (every rank refuses connections to its port), logging only the best checkpoint."""
    storage = tmp_path_factory.mktemp("isolated")
    client = MlflowClient(server)
    run_id = client.create_run(client.create_experiment("isolated"), run_name="mine").info.run_id
    port = int(server.rsplit(":", 1)[1])
    result = fit(
        storage,
        "isolated",
        MLflowSettings(
            tracking_uri=server,
            run_id=run_id,
            log_checkpoints="best",
            checkpoint_metric="user_step",
            checkpoint_mode="min",
        ),
        train_loop_config={"steps": 12, "report_at": [4, 8, 12], "checkpoint": True, "unreachable_port": port},
    )
    return result, storage, run_id


@pytest.mark.timeout(240)
def test_an_existing_run_id_is_continued(isolated, server):
    result, _, run_id = isolated
    assert result.ormas.mlflow_run_id == run_id
    [run] = runs_of(server, "isolated")
    assert run.info.status == "FINISHED" and run.data.metrics["ormas/loss"] > 0


def test_bad_mlflow_settings_fail_on_the_driver(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="must not carry credentials"):
        MLflowSettings(tracking_uri="https://bob:hunter2@mlflow.example.com")
    with pytest.raises(ValueError, match=r"tags.n: Input should be a valid string"):
        MLflowSettings(tags={"n": 3})
    with pytest.raises(TypeError, match="mlflow must be True, False or a ray_ormas.MLflowSettings"):
        RayOrmasTrainer(digits_loop, mlflow="http://x")
    with pytest.raises(ValueError, match=r"log_checkpoints: Input should be 'none', 'last', 'best' or 'all'"):
        MLflowSettings(log_checkpoints="best_val")
    with pytest.raises(ValueError, match="needs checkpoint_metric="):
        MLflowSettings(log_checkpoints="best")
    with pytest.raises(ValueError, match=r"checkpoint_mode: Input should be 'min' or 'max'"):
        MLflowSettings(log_checkpoints="best", checkpoint_metric="val", checkpoint_mode="lowest")
    with pytest.raises(ValueError, match=r"max_pending: Input should be greater than or equal to 1000"):
        MLflowSettings(max_pending=10)
    monkeypatch.setenv("RAY_ORMAS_MLFLOW_HOST_IDLE_S", "soon")  # the job's MLflow host (docs/mlflow.md)
    with pytest.raises(ValueError, match="RAY_ORMAS_MLFLOW_HOST_IDLE_S='soon' is not a number of seconds >= 0"):
        RayOrmasTrainer(digits_loop)
    RayOrmasTrainer(digits_loop, mlflow=False)  # not tracked: not read
    monkeypatch.setenv("RAY_ORMAS_MLFLOW_HOST_IDLE_S", "0")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):  # on the driver, before anything starts
        RayOrmasTrainer(
            digits_loop,
            mlflow=MLflowSettings(tracking_uri="sqlite:///c.db", run_id="0" * 32),
            run_config=RunConfig(name="c", storage_path=str(tmp_path)),
        )


def test_a_run_id_the_tracker_cannot_be_asked_about_is_named_in_one_warning(tmp_path, monkeypatch, caplog):
    # Not "does not exist" (refused there), but no answer at all: a port nothing listens on.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    caplog.set_level(logging.WARNING, logger="ray_ormas")
    RayOrmasTrainer(
        digits_loop,
        mlflow=MLflowSettings(tracking_uri=uri, run_id="0" * 32),
        run_config=RunConfig(name="c", storage_path=str(tmp_path)),
    )
    [said] = [r.getMessage() for r in caplog.records if "could not check" in r.getMessage()]
    assert uri in said and repr("0" * 32) in said and "training goes on" in said, said


INTERRUPTED_DRIVER = textwrap.dedent("""
    import sys, ray
    from ray.train import RunConfig, ScalingConfig
    sys.path.insert(0, {root!r})
    from ray_ormas import MLflowSettings, RayOrmasTrainer
    from tests.loops import digits_loop
    ray.init(address={address!r}, log_to_driver=False)  # the session's cluster: a driver (a job) of its own
    RayOrmasTrainer(digits_loop, train_loop_config={{"steps": 10000, "sleep_per_step": 0.05}}, check_every=2,
                    verbose=False, mlflow=MLflowSettings(tracking_uri={uri!r}, experiment_name="interrupted"),
                    scaling_config=ScalingConfig(num_workers=1),
                    run_config=RunConfig(name="interrupted", storage_path={storage!r})).fit()
""")


@pytest.mark.timeout(300)
def test_ctrl_c_on_the_driver_ends_the_run_as_killed(ray_cluster, server, storage):
    root = str(Path(__file__).resolve().parent.parent)
    address = ray_cluster.address_info["address"]
    script = INTERRUPTED_DRIVER.format(root=root, uri=server, storage=str(storage), address=address)
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    from ray_ormas._internal.tracking.values import fit_params, flatten_params, shown

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter22")
    flat = flatten_params(
        {"a": {"b": {"c": 1}, "empty": {}}, "l": [1, 2], "pw": "x-hunter22-y", "k" * 300: "v", "lr@warmup": 3}
    )
    assert flat["a.b.c"] == "1" and flat["a.empty"] == "{}" and flat["l"] == "[1, 2]"
    values, cut = fit_params(flat)
    assert values["pw"] == "x-***-y" and "k" * 250 in values and cut == ["k" * 300, "lr@warmup"]
    assert values["lr_warmup"] == "3"
    assert shown("https://bob:pw@host:5000/x") == "https://***@host:5000/x"


def test_relative_stores_are_made_absolute_on_the_driver(tmp_path, monkeypatch):
    from ray_ormas._internal.tracking.values import absolute_store_uri

    monkeypatch.chdir(tmp_path)
    assert absolute_store_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path / 'rel.db'}"
    assert absolute_store_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert absolute_store_uri("mlruns") == str(tmp_path / "mlruns")
    assert absolute_store_uri("http://mlflow:5000") == "http://mlflow:5000"


def test_a_continued_run_keeps_its_params_and_tags_the_changed_ones(tmp_path):
    from ray_ormas._internal.tracking.sync import new_journal, open_run

    uri = f"sqlite:///{tmp_path / 'c.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("c")).info.run_id
    client.log_param(run_id, "lr", "0.1")
    journal = new_journal(
        fit_id="f",
        run_name="c",
        tracking_uri=uri,
        experiment="c",
        mlflow_run_name="c",
        tags={},
        params={"lr": 0.2, "epochs": 3},
        run_id=run_id,
        log_checkpoints="none",
        checkpoint_metric=None,
        checkpoint_mode="min",
    )
    assert open_run(client, journal) == run_id
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1", "epochs": "3"} and run.data.tags["ray_ormas.changed_params"] == "lr"


def test_a_run_whose_creation_was_cut_short_is_taken_not_created_twice(tmp_path):
    # The tracker stored the run, then its answer (or the params after it) was lost: the next try
    # finds the fit's run by its `ray_ormas.fit_id` tag (CI once saw two runs for one fit).
    from ray_ormas._internal.tracking.sync import new_journal, open_run

    uri = f"sqlite:///{tmp_path / 'c.db'}"
    client = MlflowClient(uri)
    journal = new_journal(
        fit_id="fit-1",
        run_name="c",
        tracking_uri=uri,
        experiment="c",
        mlflow_run_name="c",
        tags={"team": "vision"},
        params={"lr": 0.2},
        run_id=None,
        log_checkpoints="none",
        checkpoint_metric=None,
        checkpoint_mode="min",
    )
    first = open_run(client, journal)
    assert open_run(client, journal) == first  # the journal still has no run id: a retry
    [run] = runs_of(uri, "c")
    assert run.info.run_id == first and run.data.tags["ray_ormas.fit_id"] == "fit-1"
    assert run.data.params == {"lr": "0.2"} and run.data.tags["team"] == "vision"
    other = open_run(client, journal.model_copy(update={"fit_id": "fit-2"}))  # another fit: its own run
    assert other != first and len(runs_of(uri, "c")) == 2


def test_loop_metrics_keep_numbers_and_skip_the_rest():
    import numpy as np
    import torch

    from ray_ormas._internal.tracking.values import loop_metrics

    kept, skipped = loop_metrics(
        {
            "a": 1,
            "b": 2.5,
            "ok": True,
            "n": np.float32(0.5),
            "t": torch.tensor(3.0),
            "nan": float("nan"),
            "inf": float("inf"),
            "s": "x",
            "l": [1],
            "d": {"x": 1},
            "none": None,
            "big": torch.ones(3),
            "ormas/loss": 1.0,
            "val/acc@1": 0.5,
            "a//b": 1.0,
            "x" * 251: 1.0,
            "val/top-1 acc": 0.25,
        }
    )
    assert {k: v for k, v in kept.items() if k not in ("nan",)} == {
        "a": 1.0,
        "b": 2.5,
        "ok": 1.0,
        "n": 0.5,
        "t": 3.0,
        "inf": math.inf,
        "val/top-1 acc": 0.25,
    }
    assert math.isnan(kept["nan"]) and sorted(skipped) == ["a//b", "big", "d", "l", "none", "s", "val/acc@1", "x" * 251]


def test_the_checkpoint_policy_picks_none_last_best_or_all():
    from ray_ormas._internal.tracking.journal import TrackingJournal
    from ray_ormas._internal.tracking.sync import chosen_checkpoints

    cps = [
        {"step": s, "path": f"/c{s}", "metrics": {"val": v}}
        for s, v in ((1, 0.5), (2, 0.2), (3, float("nan")), (4, 0.9))
    ]
    names = dict.fromkeys(("fit_id", "run_name", "tracking_uri", "experiment", "mlflow_run_name"), "x")
    base = {**names, "checkpoints": cps, "final_checkpoint": "/c4", "checkpoint_metric": "val"}
    paths = lambda **kw: [c.path for c in chosen_checkpoints(TrackingJournal(**{**base, **kw}))]  # noqa: E731
    assert paths(log_checkpoints="none") == []
    assert paths(log_checkpoints="last") == ["/c4"]
    assert paths(log_checkpoints="all") == ["/c1", "/c2", "/c3", "/c4"]
    assert paths(log_checkpoints="best", checkpoint_mode="min") == ["/c2"]
    assert paths(log_checkpoints="best", checkpoint_mode="max") == ["/c4"]


def test_a_folder_is_uploaded_once_with_empty_and_nested_files(server, tmp_path):
    """The server lists an empty file's size as None; a checkpoint can hold subfolders."""
    import pyarrow.fs as pafs

    from ray_ormas._internal.tracking.sync import upload_folder

    (tmp_path / "ck" / "model" / "shards").mkdir(parents=True)
    (tmp_path / "ck" / "alarms.jsonl").write_text("")
    (tmp_path / "ck" / "model" / "shards" / "0.pt").write_bytes(b"weights")
    client = MlflowClient(server)
    run_id = client.create_run(client.create_experiment(f"upload-{time.time_ns()}")).info.run_id
    fs = pafs.LocalFileSystem()
    assert upload_folder(client, run_id, fs, str(tmp_path / "ck"), "checkpoints/ck") == 2
    assert upload_folder(client, run_id, fs, str(tmp_path / "ck"), "checkpoints/ck") == 0
    (tmp_path / "ck" / "alarms.jsonl").write_text("{}\n")
    assert upload_folder(client, run_id, fs, str(tmp_path / "ck"), "checkpoints/ck") == 1


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_file_left_in_parts_by_a_crashed_segment_is_uploaded_whole(server, tmp_path, request, where):
    """On object storage a segment that never closed holds its JSON-lines files as parts
    (`X.parts/<offset>`); MLflow gets each one whole, as `X`, once, and again when it grew."""
    import pyarrow.fs as pafs

    from ray_ormas._internal.record.layout import part_name
    from ray_ormas._internal.tracking.sync import upload_folder

    if where == "s3":
        fs, segment = pafs.FileSystem.from_uri(f"{request.getfixturevalue('s3').bucket()}/run/segment-000")
    else:
        fs, segment = pafs.LocalFileSystem(), str(tmp_path / "segment-000")
    fs.create_dir(f"{segment}/diary.jsonl.parts")

    def write(path: str, data: bytes) -> None:
        with fs.open_output_stream(f"{segment}/{path}") as f:
            f.write(data)

    first, second = b'{"seq": 1}\n', b'{"seq": 2}\n'
    write(f"diary.jsonl.parts/{part_name(0)}", first)
    write(f"diary.jsonl.parts/{part_name(len(first))}", second)
    write("segment.json", b"{}\n")
    client = MlflowClient(server)
    run_id = client.create_run(client.create_experiment(f"parts-{time.time_ns()}")).info.run_id
    staging_folders = lambda: set(Path(tempfile.gettempdir()).glob("ray-ormas-artifacts-*"))  # noqa: E731
    before = staging_folders()
    assert upload_folder(client, run_id, fs, segment, "ormas/model/segment-000") == 2
    listed = {a.path for a in client.list_artifacts(run_id, "ormas/model/segment-000")}
    assert listed == {"ormas/model/segment-000/diary.jsonl", "ormas/model/segment-000/segment.json"}
    copy = Path(client.download_artifacts(run_id, "ormas/model/segment-000/diary.jsonl", str(tmp_path / "down")))
    assert copy.read_bytes() == first + second
    assert upload_folder(client, run_id, fs, segment, "ormas/model/segment-000") == 0
    write(f"diary.jsonl.parts/{part_name(len(first + second))}", b'{"seq": 3}\n')
    assert upload_folder(client, run_id, fs, segment, "ormas/model/segment-000") == 1
    assert staging_folders() == before  # nothing left behind
    assert fs.get_file_info(f"{segment}/diary.jsonl").type == pafs.FileType.NotFound  # the store is unchanged


# ---------------------------------------------------------------------------- MLflow equals the record
def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def assert_mlflow_equals_the_record(client: MlflowClient, run_id: str, records) -> None:
    """Loss, one layer's gradient norm, every event marker and the attempt starts, at run steps."""
    metrics = records.metrics().to_pylist()
    assert history(client, run_id, "ormas/loss") == sorted((r["run_step"], r["loss"]) for r in metrics)
    layer = dict(metrics[0]["grad"]) and next(iter(dict(metrics[0]["grad"])))
    assert history(client, run_id, f"ormas/grad_norm/{layer}") == sorted(
        (r["run_step"], dict(r["grad"])[layer]) for r in metrics
    )
    events = records.events().to_pylist()
    for name in {e["event"] for e in events}:
        marked = [s for s, v in history(client, run_id, f"ormas/events/{name}")]
        assert len(marked) == sum(e["event"] == name for e in events), name
    for name in ("certificate", "manifest", "alarm"):
        assert sorted(s for s, _ in history(client, run_id, f"ormas/events/{name}")) == sorted(
            e["run_step"] for e in events if e["event"] == name
        ), name
    starts = sorted({(s.step_offset, float(s.attempt)) for s in records.segments()})
    assert history(client, run_id, "ormas/attempt") == starts


def restart_after(server: MLflowServer, marker: Path, pause_s: float) -> threading.Thread:
    """Start the server again once it died and the worker kill marker exists (plus a pause)."""

    def run() -> None:
        deadline = time.time() + 240
        while (
            server.proc is not None and server.proc.poll() is None or not marker.exists()
        ) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(pause_s)
        server.proc = None
        server.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(600)
def test_a_killed_worker_and_a_tracker_outage_leave_mlflow_equal_to_the_record(ray_cluster, storage, tmp_path):
    server = MLflowServer(tmp_path / "outage").start()
    marker = tmp_path / "worker-killed"
    try:
        restarter = restart_after(server, marker, pause_s=3)
        config = {
            "epochs": 6,
            "kill_rank": 1,
            "kill_at": 20,
            "kill_marker": str(marker),
            "sleep_per_step": 0.2,
            "kill_server_at": 10,
            "server_pgid": server.proc.pid,
            "extra_metrics": True,
            # The outage ends inside the fit: before the last epoch, rank 0 waits for the server
            # to answer again (on a slow machine its restart took 38 s, longer than the rest of
            # the fit, and the fit's end found it still down).
            "wait_for_url": f"{server.uri}/health",
            "wait_at": 40,
        }
        result = RayOrmasTrainer(
            resume_loop,
            train_loop_config=config,
            check_every=4,
            verbose=False,
            repair=True,
            mlflow=MLflowSettings(tracking_uri=server.uri, experiment_name="outage", request_timeout_s=2),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="outage", storage_path=str(storage), failure_config=FailureConfig(max_failures=1)
            ),
        ).fit()
        restarter.join(timeout=120)
        assert server.answers() and marker.exists()
        [run] = runs_of(server.uri, "outage")
        client = MlflowClient(server.uri)
        run_id = run.info.run_id
        assert run_id == result.ormas.mlflow_run_id and run.info.status == "FINISHED" and result.ormas.mlflow_complete
        records = result.ormas.open_records()
        assert [s.attempt for s in records.segments()] == [0, 1] and records.segments()[1].step_offset == 16
        assert_mlflow_equals_the_record(client, run_id, records)
        # The loop's metrics: once per report, at the run's step (the second attempt resumes at 16).
        assert history(client, run_id, "epoch") == [(8, 0.0), (16, 1.0), (24, 2.0), (32, 3.0), (40, 4.0), (48, 5.0)]
        assert history(client, run_id, "step") == [(s, float(s)) for s in (8, 16, 24, 32, 40, 48)]
        assert all(math.isnan(v) for _, v in history(client, run_id, "ratio"))
        assert len(history(client, run_id, "loss")) == 6 and "note" not in run.data.metrics
        assert run.data.tags["ray_ormas.skipped_metrics"] == "note"
        checkpoints = json.loads(
            Path(client.download_artifacts(run_id, "ray_ormas/checkpoints.json", str(tmp_path))).read_text()
        )
        assert [c["step"] for c in checkpoints] == [8, 16, 24, 32, 40, 48]
        assert all(c["record"]["model"]["run_steps"] == c["step"] for c in checkpoints)
        assert history(client, run_id, "ormas/checkpoint") == [(s, 1.0) for s in (8, 16, 24, 32, 40, 48)]
        assert artifacts(client, run_id, "ormas/model") == {"segment-000", "segment-001"}
    finally:
        server.stop()


def sync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RAY_ORMAS, "mlflow-sync", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_an_outage_that_outlasts_the_fit_is_made_good_by_mlflow_sync(ray_cluster, storage, tmp_path, caplog):
    server = MLflowServer(tmp_path / "late")  # down for the whole fit
    caplog.set_level(logging.WARNING, logger="ray_ormas")
    result = fit(
        storage,
        "late",
        MLflowSettings(tracking_uri=server.uri, experiment_name="late", request_timeout_s=1, log_checkpoints="last"),
        train_loop_config={"steps": 12, "report_at": [6, 12], "checkpoint": True, "lesion": True},
    )
    assert result.ormas.mlflow_run_id is None and result.ormas.mlflow_complete is False
    said = [r.getMessage() for r in caplog.records if "mlflow-sync" in r.getMessage()]
    assert len(said) == 1 and str(storage / "late" / "ormas") in said[0]
    [journal] = (storage / "late" / "ormas" / ".mlflow").iterdir()
    before = journal.read_bytes()
    down = sync(str(storage / "late"))
    assert down.returncode == 1 and "unreachable" in down.stderr and "nothing was changed" in down.stderr
    assert journal.read_bytes() == before
    assert sync(str(tmp_path / "no-such-run")).returncode == 2
    server.start()
    try:
        first = sync(str(storage / "late"))
        assert first.returncode == 0 and "created" in first.stdout and "set FINISHED" in first.stdout, first
        [run] = runs_of(server.uri, "late")
        client = MlflowClient(server.uri)
        assert run.info.status == "FINISHED" and run.data.params["strategy"] == "ddp"
        assert_mlflow_equals_the_record(client, run.info.run_id, result.ormas.open_records())
        assert history(client, run.info.run_id, "user_step") == [(6, 6.0), (12, 12.0)]
        assert artifacts(client, run.info.run_id, "ormas/model/segment-000") == RECORD_FILES
        final = Path(result.checkpoint.path).name
        assert artifacts(client, run.info.run_id, "checkpoints") == {final}
        counts = {k: len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}
        again = sync(str(storage / "late" / "ormas"))
        assert again.returncode == 0 and "0 metric values and 0 files sent" in again.stdout, again
        assert {k: len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics} == counts
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_workers_that_cannot_reach_the_tracker_leave_a_complete_run(isolated, server):
    result, storage, _ = isolated
    [run] = runs_of(server, "isolated")
    client = MlflowClient(server)
    assert run.info.status == "FINISHED" and result.ormas.mlflow_complete
    assert_mlflow_equals_the_record(client, run.info.run_id, result.ormas.open_records())
    assert history(client, run.info.run_id, "user_step") == [(4, 4.0), (8, 8.0), (12, 12.0)]
    [best] = artifacts(client, run.info.run_id, "checkpoints")  # the lowest user_step: the first one
    checkpoints = sorted(p.name for p in (storage / "isolated").glob("checkpoint_*") if p.is_dir())
    assert best == checkpoints[0] and artifacts(client, run.info.run_id, f"checkpoints/{best}") == {
        "model.pt",
        ".metadata.json",
    }


@pytest.mark.timeout(300)
def test_all_checkpoints_are_uploaded_before_num_to_keep_deletes_them(healthy_fit, tmp_path):
    result = healthy_fit.result  # log_checkpoints="all", num_to_keep=1 (tests/shared_fits.py)
    uri = f"sqlite:///{healthy_fit.run_dir / 'mlflow' / 'mlflow.db'}"
    [run] = runs_of(uri, "one-run")
    client = MlflowClient(uri)
    kept = [p.name for p in healthy_fit.run_dir.glob("checkpoint_*") if p.is_dir()]
    assert kept == [Path(result.checkpoint.path).name]  # Ray kept one
    uploaded = artifacts(client, run.info.run_id, "checkpoints")
    assert len(uploaded) == 2 and set(kept) < uploaded  # MLflow has both
    listed = json.loads(
        Path(client.download_artifacts(run.info.run_id, "ray_ormas/checkpoints.json", str(tmp_path))).read_text()
    )
    assert [c["step"] for c in listed] == [8, 16] and {Path(c["path"]).name for c in listed} == uploaded


def test_the_writers_imports_take_only_idle_cpu_until_training_starts():
    """While the fit starts, MLflow's imports run at SCHED_IDLE where the thread may leave it again
    (else at nice 19 from the start); once training has started, at the writer's nice 19."""
    import os
    import threading

    from ray_ormas._internal.head.mlflow_writer import _idle_can_be_left, _Importer

    started, release = threading.Event(), threading.Event()

    def imports(uri: str) -> None:  # stands for the imports: holds the thread until the test has looked
        started.set()
        release.wait(timeout=60)

    importer = _Importer("sqlite:////nonexistent/mlflow.db", work=imports)
    importer.start()
    assert started.wait(timeout=30)
    tid = importer._tid
    try:
        if _idle_can_be_left():  # root, or CAP_SYS_NICE (this machine's CI runs as root)
            assert os.sched_getscheduler(tid) == os.SCHED_IDLE
        else:
            assert os.sched_getscheduler(tid) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, tid) == 19
        importer.promote()
        assert os.sched_getscheduler(tid) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, tid) == 19
    finally:
        release.set()
        importer.join(timeout=60)
    assert not importer.is_alive()
