"""Shared fixtures: one real local Ray cluster for the whole test session, stopped at the end.

Workers import the test loops from `tests.loops`, so the repository root goes on PYTHONPATH
before Ray starts (its worker processes inherit the driver's environment). The controller's
poll interval is lowered so that back-to-back reports do not each wait 2 s.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    ctx = ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    yield ctx
    ray.shutdown()


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path
