"""The job's MLflow host (head/mlflow_host.py, head/mlflow_link.py), on the session's Ray
cluster and without a fit: a ledger built here opens its writer in the host, the host drops the
writer of a ledger that died, applies a fit's calls in the ledger's order and ends itself when
idle, a host lost mid-fit leaves a journal that `ray-ormas mlflow-sync` finishes, and a writer
the host cannot take is written here, losing nothing. (The host serving the fits of one job is
checked on test_mlflow.py's fits.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
import ray
from mlflow import MlflowClient

from ray_ormas import MLflowSettings
from ray_ormas._internal.head.ledger import RunLedger
from ray_ormas._internal.head.mlflow_host import NAMESPACE, MLflowHost
from ray_ormas._internal.head.mlflow_link import HostedWriter
from ray_ormas._internal.head.mlflow_writer import WriterSpec
from ray_ormas._internal.record.store import RecordStore

from .test_journal import a_segment

pytestmark = pytest.mark.usefixtures("ray_cluster")
RAY_ORMAS = str(Path(sys.executable).with_name("ray-ormas"))


def spec_for(run_dir: Path, idle_s: float = 60.0) -> WriterSpec:
    """A fit's writer spec as the driver makes it, for a run at `run_dir` (the embedded store)."""
    return WriterSpec(
        settings=MLflowSettings(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}", experiment_name="host"),
        store=RecordStore.at(str(run_dir / "ormas")),
        fit_id=uuid.uuid4().hex,
        run_name=run_dir.name,
        params={"train_loop_config": {"lr": 0.1}},
        run_dir=str(run_dir),
        environment={},
        host_idle_s=idle_s,
    )


def host_holding(fit_id: str, timeout_s: float = 60) -> tuple[str, dict]:
    """The name and `served()` of the host that holds fit `fit_id`'s writer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["namespace"] != NAMESPACE:
                continue
            try:
                served = ray.get(ray.get_actor(actor["name"], namespace=NAMESPACE).served.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayActorError):  # a host that ended since the listing
                continue
            if fit_id in served["open"]:
                return actor["name"], served
        time.sleep(0.5)
    raise AssertionError(f"no MLflow host holds fit {fit_id}")


def gone(name: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return True
        time.sleep(0.5)
    return False


def journal_report(ledger, step: int) -> None:
    ray.get(ledger.track_report.remote({"loss": 0.5, "epoch": 0}, step, None), timeout=60)


@pytest.mark.timeout(180)
def test_a_ledger_opens_its_writer_in_the_host_which_drops_it_when_the_ledger_dies(tmp_path):
    spec = spec_for(tmp_path / "dies")
    ledger = RunLedger.remote(spec, None)
    journal_report(ledger, 1)
    name, served = host_holding(spec.fit_id)
    pid = served["pid"]
    ray.kill(ledger, no_restart=True)
    host = ray.get_actor(name, namespace=NAMESPACE)
    deadline = time.monotonic() + 60
    while spec.fit_id in ray.get(host.served.remote())["open"] and time.monotonic() < deadline:
        time.sleep(1)
    assert spec.fit_id not in ray.get(host.served.remote())["open"]  # dropped; the host lives on
    assert ray.get(host.served.remote())["pid"] == pid


@pytest.mark.timeout(180)
def test_a_host_lost_mid_fit_leaves_a_journal_that_mlflow_sync_finishes(tmp_path):
    run_dir = tmp_path / "lost"
    spec = spec_for(run_dir)
    ledger = RunLedger.remote(spec, None)
    try:
        journal_report(ledger, 3)
        name, _ = host_holding(spec.fit_id)
        journals = run_dir / "ormas" / ".mlflow"
        deadline = time.monotonic() + 60  # the host has written the report to the fit's journal
        while not any('"step":3' in p.read_text().replace(" ", "") for p in journals.glob("*")):
            assert time.monotonic() < deadline, "the report never reached the journal"
            time.sleep(0.2)
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        outcome = ray.get(ledger.finish_tracking.remote("FINISHED", None, None), timeout=120)
    finally:
        ray.kill(ledger, no_restart=True)
    assert not outcome.complete and "the MLflow host process was lost" in outcome.error
    a_segment(run_dir / "ormas", spec.fit_id, 0, loop_raised=False)  # the record rank 0 left
    done = subprocess.run([RAY_ORMAS, "mlflow-sync", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(spec.settings.tracking_uri)
    [run] = client.search_runs([client.get_experiment_by_name("host").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(3, 0.5)]
    assert run.info.status == "FINISHED" and run.data.tags["ray_ormas.closed_by"].startswith("ray-ormas mlflow-sync")


@pytest.mark.timeout(180)
def test_a_writer_the_host_cannot_take_is_written_here_with_every_call(tmp_path):
    with mock.patch.dict(os.environ):  # the writer sets MLflow's request variables in its process
        writer_written_here(tmp_path)


def writer_written_here(tmp_path: Path) -> None:
    spec = spec_for(tmp_path / "refused")
    host = MLflowHost.options(name=f"refusing-{spec.fit_id}", namespace=NAMESPACE, lifetime="detached").remote(60.0)
    ray.kill(host, no_restart=True)
    writer = HostedWriter(spec, host, host.open.remote(spec, None))  # a host that is gone
    writer.attempt_started(0, 0, 2)
    writer.loop_report({"loss": 0.25}, 5)
    outcome = writer.finish("FINISHED", None, None)
    assert outcome.complete and outcome.run_id
    client = MlflowClient(spec.settings.tracking_uri)
    assert [(m.step, m.value) for m in client.get_metric_history(outcome.run_id, "loss")] == [(5, 0.25)]
    assert client.get_run(outcome.run_id).info.status == "FINISHED"


@pytest.mark.timeout(180)
def test_calls_that_come_before_their_turn_or_before_the_writer_are_applied_in_the_ledgers_order(tmp_path):
    spec = spec_for(tmp_path / "ordered")
    host = MLflowHost.options(name=f"ordered-{spec.fit_id}", namespace=NAMESPACE, lifetime="detached").remote(60.0)
    try:
        # The second call (a report) and then the first (attempt 1 starts) arrive before open():
        # applied as numbered, the report belongs to attempt 1.
        host.call.remote(spec.fit_id, 1, "loop_report", ({"loss": 0.5}, 7, None, None))
        host.call.remote(spec.fit_id, 0, "attempt_started", (1, 0, 2))
        opened = host.open.remote(spec, None)
        # As HostedWriter.finish does, flush once open() has answered: flush runs in another of the
        # host's concurrency groups, so sent at once it could run before the calls above were taken.
        ray.get(opened, timeout=90)
        assert ray.get(host.flush.remote(spec.fit_id, 2, 60.0), timeout=90)
        outcome = ray.get(host.finish.remote(spec.fit_id, "FINISHED", None, None), timeout=120)
        assert outcome.complete
        [journal] = (tmp_path / "ordered" / "ormas" / ".mlflow").iterdir()
        reports = json.loads(journal.read_text())["reports"]
        assert [(r["step"], r["attempt"]) for r in reports] == [(7, 1)]
        assert ray.get(host.served.remote())["open"] == []
    finally:
        ray.kill(host, no_restart=True)


@pytest.mark.timeout(120)
def test_a_host_with_no_fit_ends_itself_after_its_idle_time():
    name = f"idle-{uuid.uuid4().hex}"
    host = MLflowHost.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(1.0)
    assert ray.get(host.served.remote(), timeout=60)["open"] == []
    assert gone(name, timeout_s=30)
