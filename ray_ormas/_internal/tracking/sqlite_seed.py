"""A new local SQLite tracking store made by copying an empty one that MLflow built once.

MLflow builds a new SQLite store by running its whole schema migration: about 4 s of CPU on a
small machine, paid again by every fit whose store is new (each run's embedded store is). Here
MLflow builds one empty store per MLflow version, in a cache folder (`ray_ormas_cache` in the
temp folder), and a store that does not exist yet starts as a copy of it: the same tables, the
same schema version, the same `Default` experiment (its artifact location is the one MLflow gave
it in the process that built the cache). A store that exists is never touched.

Anything that goes wrong here (an unwritable cache, a copy that fails) only costs the speed-up:
MLflow then builds the store itself, as it would have.

Hooks relied on: `MlflowClient(tracking_uri="sqlite:////path")` builds and migrates a store at a
path that does not exist; SQLite's online backup API (the stdlib's `sqlite3.Connection.backup`)
copies a whole database consistently.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

from ray_ormas._internal.common.logs import get_logger

logger = get_logger("ray_ormas.mlflow")

SQLITE_PREFIX = "sqlite:///"
CACHE_FOLDER = "ray_ormas_cache"


def new_store_path(uri: str) -> Path | None:
    """The file of a local SQLite store `uri` names when it does not exist yet; else None."""
    if not uri.startswith(SQLITE_PREFIX) or "?" in uri or ":memory:" in uri:
        return None
    path = Path(uri.removeprefix(SQLITE_PREFIX))
    if not path.is_absolute() or path.exists():
        return None
    return path


def seed_new_store(uri: str) -> bool:
    """Start the store `uri` names as a copy of the cached empty store, when it is a local SQLite
    file that does not exist yet. True when it was seeded; False when MLflow builds it itself."""
    target = new_store_path(uri)
    if target is None:
        return False
    try:
        seed = _cached_empty_store()
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.seed")
        _copy_database(seed, partial)
        try:
            os.link(partial, target)  # never over a store that appeared meanwhile
        except FileExistsError:
            pass
        finally:
            partial.unlink(missing_ok=True)
        return True
    except Exception as e:  # only the speed-up is lost
        logger.debug("MLflow builds the store at %s itself (no seed: %s: %s)", target, type(e).__name__, e)
        return False


def _cached_empty_store() -> Path:
    """The empty store of this MLflow version in the cache folder, built by MLflow if missing."""
    import mlflow
    from mlflow import MlflowClient

    folder = Path(tempfile.gettempdir()) / CACHE_FOLDER
    folder.mkdir(exist_ok=True)
    seed = folder / f"mlflow-{mlflow.__version__}-empty.db"
    if seed.is_file():
        return seed
    built = folder / f".mlflow-{mlflow.__version__}-{os.getpid()}.db"
    MlflowClient(tracking_uri=f"{SQLITE_PREFIX}{built}").search_experiments()  # builds and migrates it
    partial = built.with_suffix(".copy")
    _copy_database(built, partial)  # a consistent copy, whatever the journal mode MLflow chose
    os.replace(partial, seed)
    with contextlib.suppress(OSError):
        built.unlink()
    return seed


def _copy_database(source: Path, target: Path) -> None:
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
