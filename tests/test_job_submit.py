"""`ray job submit -- ray-ormas train CONFIG.yaml` against a real, token-authenticated Ray head.

The test starts its own head node (`ray start --head --block`, bound to 127.0.0.1, with
`RAY_AUTH_MODE=token`) in its own process group and temp dir, submits the digits example with
`--working-dir`, waits for SUCCEEDED, checks the job's output, the record in storage and the MLflow
run, and then stops exactly what it started: the head's process group, then any process left
holding the test's unique paths. The session's own Ray cluster is untouched.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run

from .conftest import ROOT

pytestmark = pytest.mark.system  # its own Ray head or cluster

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def stop(head: subprocess.Popen, *marks: str) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        try:
            head.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for mark in marks:  # anything of ours that left the group (the job's driver, Ray's daemons)
        subprocess.run(["pkill", "-9", "-f", mark], check=False)


@pytest.mark.timeout(600)
def test_ray_job_submit_runs_the_config_on_a_token_authenticated_head(tmp_path):
    mark = f"ro-{secrets.token_hex(3)}"
    temp_dir = Path("/tmp") / mark  # short: Ray's socket paths live under it
    storage = tmp_path / f"storage-{mark}"
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    gcs, dashboard = free_port(), free_port()
    address = f"http://127.0.0.1:{dashboard}"
    log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            "--include-dashboard=true",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            "--num-cpus=2",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while ray_cli("job", "list", "--address", address, env=env).returncode != 0:
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the head's job server did not come up in 120 s"
            time.sleep(2)

        # Token authentication is on: a wrong token is refused.
        wrong = ray_cli("job", "list", "--address", address, env={**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)})
        assert wrong.returncode != 0

        sid = f"ray-ormas-{mark}"
        submit = (
            "job",
            "submit",
            "--address",
            address,
            "--working-dir",
            str(work),
            "--submission-id",
            sid,
            "--no-wait",
            "--",
            "ray-ormas",
            "train",
            "examples/digits_repair.yaml",
            "--set",
            "train.epochs=2",
            "--set",
            f"storage.path={storage}",
        )
        deadline = time.monotonic() + 90
        while True:  # the job server answers before its agent is ready to take a job
            submitted = ray_cli(*submit, env=env)
            if submitted.returncode == 0 or "No available agent" not in submitted.stderr:
                break
            assert time.monotonic() < deadline, submitted.stderr[-2000:]
            time.sleep(3)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        deadline = time.monotonic() + 420
        while True:
            status = ray_cli("job", "status", "--address", address, sid, env=env).stdout.lower()
            if any(f"job '{sid}' {end}" in status for end in ("succeeded", "failed", "stopped")):
                break
            assert time.monotonic() < deadline, f"the job did not finish in 420 s: {status}"
            time.sleep(3)
        logs = ray_cli("job", "logs", "--address", address, sid, env=env).stdout
        assert f"job '{sid}' succeeded" in status, logs[-5000:]

        assert "connecting to the Ray cluster at" in logs
        assert "[ray-ormas] model step      0" in logs and "repaired   96 ch" in logs  # progress lines
        assert "conv2.0       0         32        32             0  repaired" in logs  # the summary
        record = storage / "digits-repair" / "ormas" / "model" / "segment-000"
        assert verify_run(record).ok and (record / "report.html").is_file()
        client = MlflowClient(f"sqlite:///{storage / 'digits-repair' / 'mlflow' / 'mlflow.db'}")
        (run,) = client.search_runs(client.get_experiment_by_name("ray-ormas").experiment_id)
        assert run.info.status == "FINISHED" and run.data.params["monitor.repair"] == "True"
        assert run.data.params["train_loop_config.train.epochs"] == "2"

        # A relative storage path would live in the job's temporary working directory: refused
        # on the driver, exit 2, the job FAILED with the reason, nothing trained.
        relative = ray_cli(
            "job",
            "submit",
            "--address",
            address,
            "--working-dir",
            str(work),
            "--",
            "ray-ormas",
            "train",
            "examples/digits_repair.yaml",
            "--set",
            "storage.path=./runs",
            env=env,
            timeout=300,
        )
        assert relative.returncode != 0
        said = relative.stdout + relative.stderr
        assert "storage.path: './runs' is a relative path, and this runs under `ray job submit`" in said, said[-3000:]
        assert "exit code 2" in said or "failed" in said.lower()
    finally:
        stop(head, str(temp_dir), str(storage))
        log.close()
        shutil.copytree(
            temp_dir / "session_latest" / "logs",
            tmp_path / "ray-logs",
            dirs_exist_ok=True,
            ignore_dangling_symlinks=True,
        ) if (temp_dir / "session_latest").exists() else None
        shutil.rmtree(temp_dir, ignore_errors=True)
    leftover = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True).stdout.split()
    assert leftover == [], f"processes left running: {leftover}"
