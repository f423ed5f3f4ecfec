"""A new local SQLite MLflow store starts as a copy of an empty store MLflow built once
(ray_ormas/_internal/tracking/sqlite_seed.py): the same schema as one MLflow builds itself,
usable at once, and a store that exists is never touched."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from mlflow import MlflowClient

from ray_ormas._internal.tracking import sqlite_seed
from ray_ormas._internal.tracking.sqlite_seed import new_store_path, seed_new_store


def schema(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str]]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = db.execute("SELECT type, name FROM sqlite_master ORDER BY type, name").fetchall()
        version = db.execute("SELECT version_num FROM alembic_version").fetchall()
    return tables, version


def test_a_seeded_store_is_the_store_mlflow_builds_and_works(tmp_path):
    built = tmp_path / "built.db"
    MlflowClient(tracking_uri=f"sqlite:///{built}").search_experiments()  # MLflow's own migration
    seeded = tmp_path / "runs" / "mlflow" / "mlflow.db"
    assert seed_new_store(f"sqlite:///{seeded}") and seeded.is_file()
    assert schema(seeded) == schema(built)
    client = MlflowClient(tracking_uri=f"sqlite:///{seeded}")
    run = client.create_run(client.create_experiment("x"))
    client.log_metric(run.info.run_id, "loss", 0.5, step=3)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(3, 0.5)]
    assert [e.name for e in client.search_experiments()] == ["x", "Default"]


def test_an_existing_store_and_other_uris_are_left_alone(tmp_path):
    existing = tmp_path / "mlflow.db"
    existing.write_bytes(b"not touched")
    assert not seed_new_store(f"sqlite:///{existing}") and existing.read_bytes() == b"not touched"
    for uri in (
        "http://127.0.0.1:5000",
        "sqlite:///relative.db",
        "sqlite:///:memory:",
        f"sqlite:///{tmp_path}/a.db?x=1",
    ):
        assert new_store_path(uri) is None and not seed_new_store(uri), uri
    assert not (tmp_path / "a.db").exists()


def test_a_failing_seed_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    def broken() -> Path:
        raise OSError("read-only cache")

    monkeypatch.setattr(sqlite_seed, "_cached_empty_store", broken)
    target = tmp_path / "mlflow.db"
    assert seed_new_store(f"sqlite:///{target}") is False and not target.exists()
    MlflowClient(tracking_uri=f"sqlite:///{target}").search_experiments()  # MLflow builds it as before
    assert target.is_file()


def test_seeding_again_after_use_changes_nothing(tmp_path):
    target = tmp_path / "mlflow.db"
    assert seed_new_store(f"sqlite:///{target}")
    client = MlflowClient(tracking_uri=f"sqlite:///{target}")
    client.create_experiment("kept")
    assert not seed_new_store(f"sqlite:///{target}")  # it exists now: never replaced
    assert [e.name for e in client.search_experiments()] == ["kept", "Default"]
