"""Bringing a record folder in object storage up to date by sending only what is new.

The record's files are append-only JSON lines (`diary.jsonl`, `metrics.jsonl`, the fleet
record's `checks.jsonl` and `alarms.jsonl`) plus a few small files. Object stores cannot append,
so copying the folder at every checkpoint sends the whole record each time: quadratic over a
long run. `IncrementalUpload.push` sends each JSON-lines file's new complete lines as one
immutable part, `<file>.parts/<offset>` (the byte offset where the part starts), and a small file
only when it changed. `finish` (when the segment is closed) writes each file whole, once, and
deletes its parts, so a finished segment looks exactly like one on a local disk.

Readers never see the difference: `RecordStore.read_bytes` and `RecordStore.download` put a file
together from its parts when it has no whole copy yet (a segment whose writer was killed, or one
being written). Parts are placed at their offsets, so a part sent twice (a retry after a timeout
that had in fact succeeded) does no harm.

Hooks relied on: `pyarrow.fs` (`create_dir`, `open_output_stream`, `FileSelector`, `delete_dir`)
through RecordStore (record/store.py).
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import pyarrow.fs as pafs

from ray_ormas._internal.record.layout import part_name, parts_folder
from ray_ormas._internal.record.store import RecordStore

APPEND_ONLY_SUFFIX = ".jsonl"


class IncrementalUpload:
    """Keeps `remote` (a folder in `store`) up to date with `local`, a flat folder whose
    `.jsonl` files only grow. Not thread-safe: one caller at a time."""

    def __init__(self, store: RecordStore, local: Path, remote: str) -> None:
        self.store = store
        self.local = Path(local)
        self.remote = remote
        self._sent: dict[str, int] = {}  # .jsonl file -> bytes already in parts
        self._small: dict[str, tuple[int, int]] = {}  # other file -> (size, mtime_ns) sent
        self._folders: set[str] = set()  # folders made in the store

    def push(self) -> int:
        """Send what is new since the last successful push; return the bytes sent. Raises on a
        storage error; what was sent before the error counts, the rest goes next time."""
        sent = 0
        for path in self._files():
            if path.name.endswith(APPEND_ONLY_SUFFIX):
                sent += self._push_lines(path)
            else:
                sent += self._push_small(path)
        return sent

    def finish(self) -> int:
        """Write every file whole and delete the parts: the folder in storage is then the same as
        the local one. Returns the bytes sent."""
        sent = 0
        for path in self._files():
            if path.name.endswith(APPEND_ONLY_SUFFIX):
                data = path.read_bytes()
                self.store.write_bytes(posixpath.join(self._folder(self.remote), path.name), data)
                self._delete_parts(path.name)
                self._sent[path.name] = len(data)
                sent += len(data)
            else:
                sent += self._push_small(path)
        return sent

    def _files(self) -> list[Path]:
        return sorted(p for p in self.local.iterdir() if p.is_file() and not p.name.endswith(".tmp"))

    def _push_lines(self, path: Path) -> int:
        start = self._sent.get(path.name, 0)
        with open(path, "rb") as f:
            f.seek(start)
            new = f.read()
        complete = new[: new.rfind(b"\n") + 1]  # whole lines only: a line being written waits
        if not complete:
            return 0
        parts = self._folder(posixpath.join(self.remote, parts_folder(path.name)))
        self.store.write_bytes(posixpath.join(parts, part_name(start)), complete)
        self._sent[path.name] = start + len(complete)
        return len(complete)

    def _push_small(self, path: Path) -> int:
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        if self._small.get(path.name) == key:
            return 0
        data = path.read_bytes()
        self.store.write_bytes(posixpath.join(self._folder(self.remote), path.name), data)
        self._small[path.name] = key
        return len(data)

    def _folder(self, path: str) -> str:
        """`path`, made in the store the first time (object stores need no folders; a
        filesystem over a disk does)."""
        if path not in self._folders:
            self.store.filesystem.create_dir(path, recursive=True)
            self._folders.add(path)
        return path

    def _delete_parts(self, name: str) -> None:
        parts = posixpath.join(self.remote, parts_folder(name))
        try:
            self.store.filesystem.delete_dir(parts)
        except OSError:
            infos = self.store.filesystem.get_file_info(pafs.FileSelector(parts, allow_not_found=True))
            for info in infos:  # a store without real folders
                self.store.filesystem.delete_file(info.path)
