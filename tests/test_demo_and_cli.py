"""The README's demo, run for real on a fresh clone exactly as the README says, and the command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ormas_monitor.record import verify_run

ARM_ROW = re.compile(r"^(healthy|watch|repair)\s+([\d.]+)%\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", re.M)
REPORT_ROW = re.compile(r"^  (healthy|watch|repair)\s+(\S+report\.html)$", re.M)
PAGE_ROW = re.compile(r"^  (healthy|watch|repair)\s+(\S+run\.html)$", re.M)


@pytest.mark.timeout(1800)
def test_demo_dead_run_sits_near_chance_and_repair_comes_back(clone):
    """The README's demo command, run once per session on a fresh clone (tests/fresh_clone.py):
    what it prints, the records it names, and its MLflow store."""
    out = clone.demo.out
    assert clone.demo.code == 0, out[-4000:]
    rows = {m[0]: m[1:] for m in ARM_ROW.findall(out)}
    assert sorted(rows) == ["healthy", "repair", "watch"], out[-3000:]
    acc = {arm: float(r[0]) for arm, r in rows.items()}
    repaired, certificates, _, stuck = ({arm: int(r[i]) for arm, r in rows.items()} for i in (1, 2, 3, 4))
    assert acc["healthy"] > 90
    assert acc["watch"] < 25  # 10 classes: chance is ~10%
    assert acc["repair"] > acc["healthy"] - 5
    assert (repaired["watch"], repaired["repair"]) == (0, 32 + 64)
    assert certificates["watch"] == certificates["repair"] == 2 and certificates["healthy"] == 0
    assert stuck["watch"] == 32 + 64 and stuck["repair"] == 0
    # Each fit's goodput in one line (docs/goodput.md), and `ray-ormas goodput` on a run's record.
    assert len(re.findall(r"\[ray-ormas\] goodput \d+% of ", out)) == 3, out[-3000:]
    reports = dict(REPORT_ROW.findall(out))
    assert sorted(reports) == ["healthy", "repair", "watch"]
    for report in reports.values():
        path = clone.root / report if not report.startswith("/") else Path(report)
        assert path.is_file() and verify_run(path.parent).ok, path
    # Each run's page, named before the per-segment reports: the page a person opens first.
    pages = dict(PAGE_ROW.findall(out))
    assert sorted(pages) == ["healthy", "repair", "watch"] and out.index("each run on one page") < out.index(
        "reports per segment"
    )
    for arm, page in pages.items():
        path = clone.root / page if not page.startswith("/") else Path(page)
        assert path.is_file() and path.parent.parent.name == f"digits-{arm}", path
    # One MLflow store and experiment for the three arms, and the command that opens it.
    store = clone.root / "ray_ormas_demo" / "mlflow.db"
    assert "mlflow ui --backend-store-uri sqlite:///ray_ormas_demo/mlflow.db" in out
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
