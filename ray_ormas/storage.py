"""Where rank 0 writes the ormas record, and how a rerun or restart never overwrites one.

Layout, under the record root (by default `<storage_path>/<run name>/ormas` when the run's
storage is a local path, else `~/ray_results/ray_ormas/<run name>` on rank 0's node):

    ormas/
      model/                  one folder per monitor (its name; "model" by default)
        segment-000/          diary.jsonl, metrics.jsonl, report.html, summary.html, summary.md
        segment-001/          the next attempt (worker-group restart) or rerun under the same name

ormas-monitor refuses to start a record in a folder that already holds one, and `overwrite=True`
over a real record is data loss; so rank 0 claims the next free `segment-NNN` with an atomic
`mkdir` instead. Persisting the record through `pyarrow.fs` to remote run storage is the job of
the storage layer built on this module (see docs/architecture.md).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ray.train import RunConfig

SEGMENT = re.compile(r"^segment-(\d{3,})$")


def is_local_storage(run_config: RunConfig) -> bool:
    """True when the run's storage is a plain path on this machine (no custom filesystem, no URI)."""
    path = str(run_config.storage_path)
    return run_config.storage_filesystem is None and ("://" not in path or path.startswith("file://"))


def default_record_root(run_config: RunConfig) -> str:
    """Record root for a run: inside its local storage folder, else a local folder on rank 0's node."""
    if is_local_storage(run_config):
        base = str(run_config.storage_path).removeprefix("file://")
        return os.path.join(os.path.expanduser(base), run_config.name, "ormas")
    return os.path.join(os.path.expanduser("~/ray_results"), "ray_ormas", run_config.name)


def claim_segment(monitor_dir: str | Path) -> Path:
    """Create and return the next free `segment-NNN` folder under `monitor_dir` (atomic mkdir)."""
    monitor_dir = Path(monitor_dir)
    monitor_dir.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in monitor_dir.iterdir() if (m := SEGMENT.match(p.name))]
    index = max(taken, default=-1) + 1
    while True:
        path = monitor_dir / f"segment-{index:03d}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            index += 1


def segments(monitor_dir: str | Path) -> list[Path]:
    """The segment folders of one monitor, oldest first."""
    monitor_dir = Path(monitor_dir)
    if not monitor_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in monitor_dir.iterdir() if (m := SEGMENT.match(p.name))]
    return [p for _, p in sorted(found)]
