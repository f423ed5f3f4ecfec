"""Copies of the checkpoints a restart after damage may resume from, kept in the run's storage
until the fit ends, whatever `CheckpointConfig(num_to_keep)` deletes meanwhile.

    FleetActions (head/fleet_actions.py), when a check is not clean or a checkpoint is registered
    while one is not, and a `divergence` or `nonfinite` alarm could restart the group (its action,
    or a policy): CheckpointPins.pin(the book's checkpoint at risk), on a thread of its own
    a restart after damage whose chosen checkpoint is gone -> CheckpointPins.kept(it): the copy
    the fit ends -> CheckpointPins.release(): every copy deleted

Copies go to `<record root>/.pinned/<fit id>/<checkpoint folder>`, on the record's filesystem,
with `pyarrow.fs.copy_files` (a server-side copy on object storage where pyarrow makes one). A
copy is made once per checkpoint; one that fails is logged, and the restart then falls back as
before (Ray's latest, said on the action's line). The fit's end waits for a copy under way at
most PIN_WAIT_S (head/fleet_actions.py); one that takes longer deletes itself once done. A driver
that dies leaves its copies: they are under the record root's `.pinned/`, safe to delete once no
fit of the run is running.

Hooks relied on: `pyarrow.fs.copy_files`, `FileSystem.delete_dir`, `ray.train.Checkpoint(path,
filesystem)`.
"""

from __future__ import annotations

import posixpath
import threading
from typing import Any

import pyarrow.fs as pafs

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.store import RecordStore

logger = get_logger("ray_ormas.fleet")
PINNED_DIR = ".pinned"


class CheckpointPins:
    """One fit's kept copies (see the module docstring)."""

    def __init__(self, store: RecordStore, fit_id: str) -> None:
        self._store = store
        self.root = posixpath.join(store.root, PINNED_DIR, fit_id)
        self._copies: dict[str, Any] = {}  # the original's path -> its copy (a ray.train.Checkpoint)
        self._lock = threading.Lock()
        self._released = False

    def pin(self, checkpoint: Any) -> None:
        """Copy `checkpoint` (a ray.train.Checkpoint) into the record's storage, once."""
        from ray.train import Checkpoint

        source = str(checkpoint.path)
        with self._lock:
            if source in self._copies or self._released:
                return
        target = posixpath.join(self.root, posixpath.basename(source.rstrip("/")) or "checkpoint")
        try:
            self._store.filesystem.create_dir(target, recursive=True)  # copy_files fills it, it does not make it
            pafs.copy_files(
                source,
                target,
                source_filesystem=checkpoint.filesystem,
                destination_filesystem=self._store.filesystem,
            )
        except Exception as e:  # without the copy the restart falls back as before, said there
            logger.warning("fleet: could not keep a copy of checkpoint %s (%s: %s)", source, type(e).__name__, e)
            return
        with self._lock:
            released = self._released
            if not released:
                self._copies[source] = Checkpoint(target, filesystem=self._store.filesystem)
        if released:  # the fit ended during the copy
            self._delete(self.root)
            return
        logger.info("fleet: kept a copy of checkpoint %s at %s until the fit ends", source, self._store.shown(target))

    def kept(self, checkpoint: Any) -> Any:
        """The copy of `checkpoint`, or None."""
        with self._lock:
            return self._copies.get(str(checkpoint.path))

    def release(self) -> None:
        """The fit ended: every copy is deleted."""
        with self._lock:
            self._released = True
            self._copies = {}
        self._delete(self.root)

    def _delete(self, path: str) -> None:
        try:
            if self._store.filesystem.get_file_info(path).type != pafs.FileType.NotFound:
                self._store.filesystem.delete_dir(path)
        except Exception as e:
            logger.warning("fleet: could not delete the kept copies at %s (%s: %s)", path, type(e).__name__, e)
