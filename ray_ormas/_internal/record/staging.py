"""Rank 0's staging folders on object storage, made good at the end of a fit.

On a store that is not a local path (S3, GCS, ...), rank 0's monitor writes its segment to a
staging folder on its node, and worker/session.py uploads that folder at every checkpoint and at the end,
then removes it. Two cases leave a staging folder behind: rank 0 was killed (SIGKILL, OOM), so the
segment in storage stops at its last checkpoint while the node still holds every row up to the
kill; or storage was down when training ended. At the end of the fit, `sweep` runs a small task
pinned to each such node that uploads what is left and removes the folder; a folder it cannot
upload stays, and the driver says where it is. A node that is gone took its folder along (the
segment then ends at its last upload).

Hooks relied on: `ray.remote` tasks with `NodeAffinitySchedulingStrategy(soft=False)`, and
`IncrementalUpload.finish` (record/uploads.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.record.uploads import IncrementalUpload

logger = get_logger("ray_ormas")
SWEEP_TIMEOUT_S = 300


@dataclass(frozen=True)
class Staging:
    """A segment's staging folder: where rank 0 wrote it, and where it goes in the store."""

    monitor: str
    segment_path: str
    folder: str
    node_id: str
    node_ip: str


@ray.remote(num_cpus=0, max_retries=0)
def _upload_leftover(store: RecordStore, folder: str, segment_path: str) -> str | None:
    """On the staging folder's node: upload it if it is still there, then remove it. Returns None
    when done (or nothing was left), else why it stays."""
    path = Path(folder)
    if not path.is_dir():
        return None
    try:
        IncrementalUpload(store, path, segment_path).finish()
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:500]
    shutil.rmtree(path, ignore_errors=True)
    return None


def sweep(store: RecordStore, staged: list[Staging], timeout_s: float = SWEEP_TIMEOUT_S) -> list[str]:
    """Upload every staging folder still on its node; return a message for each that stays."""
    if store.is_local or not staged:
        return []
    tasks = {}
    for s in staged:
        pinned = NodeAffinitySchedulingStrategy(s.node_id, soft=False)
        tasks[s] = _upload_leftover.options(scheduling_strategy=pinned).remote(store, s.folder, s.segment_path)
    left: list[str] = []
    for s, ref in tasks.items():
        try:
            error = ray.get(ref, timeout=timeout_s)
        except Exception as e:  # the node is gone, or the task did not finish in time
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        if error is not None:
            left.append(
                f"the record of monitor {s.monitor!r} could not be brought up to date in "
                f"{store.shown(s.segment_path)} ({error}); its local copy is {s.folder} on node {s.node_ip}: "
                f"copy its files there when storage is back"
            )
    for message in left:
        logger.warning("%s", message)
    return left
