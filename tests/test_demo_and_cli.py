"""The README's demo, run for real on the session's Ray cluster, and the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ormas_monitor.record import verify_run

from ray_ormas import demo


@pytest.mark.timeout(420)
def test_demo_dead_run_sits_near_chance_and_repair_comes_back(ray_cluster, tmp_path, capsys):
    results = {r.arm: r for r in demo.run(out=tmp_path / "demo")}
    healthy, watch, repair = results["healthy"], results["watch"], results["repair"]
    assert healthy.accuracy > 90
    assert watch.accuracy < 25  # 10 classes: chance is ~10%
    assert repair.accuracy > healthy.accuracy - 5
    assert (watch.channels_repaired, repair.channels_repaired) == (0, 32 + 64)
    assert watch.certificates == repair.certificates == 2 and healthy.certificates == 0
    assert watch.stuck_channels == 32 + 64 and repair.stuck_channels == 0
    for r in results.values():
        assert r.report.is_file() and verify_run(r.report.parent).ok
    table = capsys.readouterr().out
    assert "test acc" in table and str(repair.report) in table
    # One MLflow store and experiment for the three arms, and the command that opens it.
    store = tmp_path / "demo" / "mlflow.db"
    assert f"mlflow ui --backend-store-uri sqlite:///{store}" in table
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("ray-ormas-demo").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["digits-healthy", "digits-repair", "digits-watch"]
    assert all(r.info.status == "FINISHED" for r in runs)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ray_ormas", *args], capture_output=True, text=True, timeout=60)


def test_cli_version_help_and_usage_errors():
    from ray_ormas import __version__

    assert run_cli("--version").stdout.strip() == f"ray-ormas {__version__}"
    helped = run_cli("demo", "--help")
    assert helped.returncode == 0 and "--epochs" in helped.stdout
    assert run_cli().returncode == 2
    assert run_cli("demo", "--epochs", "many").returncode == 2
