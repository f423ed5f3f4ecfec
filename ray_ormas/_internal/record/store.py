"""Where the ormas record persists: the run's own storage, through any pyarrow filesystem.

Layout, under the record root (by default `<storage_path>/<run name>/ormas`, beside Ray's
checkpoints, on `RunConfig.storage_filesystem` or the filesystem the storage URI names):

    ormas/
      model/                  one folder per monitor (its name; "model" by default)
        segment-000/          diary.jsonl, metrics.jsonl, segment.json, report.html, summary.html, summary.md
        segment-001/          the next attempt (worker-group restart) or a rerun under the same name

ormas-monitor refuses to start a record in a folder that already holds one, and `overwrite=True`
over a real record is data loss; so rank 0 claims the next free `segment-NNN`. On a local (or NFS-
mounted) path the claim is an atomic `mkdir` and the monitor writes there directly. On any other
filesystem (S3, GCS, HDFS, a `SubTreeFileSystem`, an fsspec one) the claim is the segment's
`segment.json`, the monitor writes to a staging folder on rank 0's node, and storage is brought up
to date from that folder at every checkpoint and at the end, sending only what is new (record/uploads.py;
`read_bytes` and `download` put files sent in parts together again). Two `fit()`s running at the
same time under the same run name on object storage could claim the same segment: object stores have
no atomic create, so do not do that (Ray's own checkpoints would collide too).

Hooks relied on: `RunConfig.storage_path` / `storage_filesystem` / `name`, resolved the way Ray
Train resolves them (`pyarrow.fs.FileSystem.from_uri` unless a filesystem is given, then the
path is a path on it), and `pyarrow.fs` (`copy_files`, `open_output_stream`, `FileSelector`).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from ray_ormas._internal.record.layout import (
    PARTS_SUFFIX,
    RECORD_DIR,
    SEGMENT_FILE,
    join_parts,
    json_lines,
    parts_folder,
    segment_index,
    segment_name,
    whole_name,
)
from ray_ormas.errors import OptionTypeError, RecordStorageError

if TYPE_CHECKING:
    from ray.train import RunConfig


@dataclass(frozen=True)
class RecordStore:
    """A record root on a pyarrow filesystem. Picklable: it travels to the workers in the plan.

    Attributes:
        filesystem: any `pyarrow.fs.FileSystem`.
        root: the `ormas` folder's path on it (no scheme).
    """

    filesystem: pafs.FileSystem
    root: str

    @classmethod
    def for_run(cls, run_config: RunConfig, record_dir: str | os.PathLike | None = None) -> RecordStore:
        """The store a run's record goes to: `record_dir` if given (a local path or a URI), else
        `<storage_path>/<name>/ormas` on the run's storage."""
        if record_dir is not None:
            return cls.at(record_dir)
        fs, base = resolve(run_config.storage_path, run_config.storage_filesystem)
        return cls(fs, posixpath.join(base, run_config.name, RECORD_DIR))

    @classmethod
    def at(cls, path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> RecordStore:
        fs, root = resolve(path, filesystem)
        return cls(fs, root)

    @property
    def is_local(self) -> bool:
        """True when paths in this store are paths on this machine (a local disk or a mount)."""
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def shown(self, path: str | None = None) -> str:
        """A path in this store as a user would type it (`s3://bucket/...`, or a local path)."""
        path = self.root if path is None else path
        if self.is_local:
            return path
        scheme = self.filesystem.type_name
        return f"{scheme}://{path}" if scheme in ("s3", "gcs", "hdfs") else f"{path} (on {scheme} filesystem)"

    def local_path(self, path: str) -> Path | None:
        return Path(path) if self.is_local else None

    def monitor_dir(self, monitor: str) -> str:
        return posixpath.join(self.root, monitor)

    # ------------------------------------------------------------------ checks
    def check_writable(self, timeout_s: float | None = None) -> None:
        """Write and delete a probe file in the root, or raise RecordStorageError naming the path
        and the reason. Called on the driver before any worker starts. Folders it had to create
        on a local store are removed again, so a trainer that is never fit leaves no trace.

        The probe gets `timeout_s` seconds (default: $RAY_ORMAS_STORAGE_CHECK_TIMEOUT_S, else
        20): an endpoint that takes connections but never answers keeps pyarrow's S3 client
        retrying for minutes, so the check gives up and says so instead."""
        timeout_s = storage_check_timeout_s() if timeout_s is None else timeout_s
        outcome: list[BaseException | None] = []
        probe = threading.Thread(
            target=lambda: outcome.append(self._probe_write()), daemon=True, name="ray-ormas-storage-check"
        )
        probe.start()
        probe.join(timeout_s)
        if not outcome:
            raise RecordStorageError(
                f"cannot write the ormas record to {self.shown()}: the storage did not answer within {timeout_s:g} s"
                f"{_endpoint_hint(self.filesystem)}. {STORAGE_ADVICE} RAY_ORMAS_STORAGE_CHECK_TIMEOUT_S sets how long "
                f"this check waits."
            )
        if outcome[0] is not None:
            e = outcome[0]
            raise RecordStorageError(
                f"cannot write the ormas record to {self.shown()}: {type(e).__name__}: {e}."
                f"{_credentials_hint(self.filesystem)} {STORAGE_ADVICE}"
            ) from None

    def _probe_write(self) -> BaseException | None:
        probe = posixpath.join(self.root, f".ray-ormas-write-check-{uuid.uuid4().hex}")
        created = self._first_missing_folder()
        try:
            self.filesystem.create_dir(self.root, recursive=True)
            with self.filesystem.open_output_stream(probe) as f:
                f.write(b"ok")
            self.filesystem.delete_file(probe)
            if created is not None:
                self.filesystem.delete_dir(created)
        except Exception as e:
            return e
        return None

    def _first_missing_folder(self) -> str | None:
        if not self.is_local:
            return None
        missing, path = None, self.root
        while path and not os.path.lexists(path):
            missing, parent = path, os.path.dirname(path)
            if parent == path:
                break
            path = parent
        return missing if path and os.path.isdir(path) else None

    # ------------------------------------------------------------------ segments
    def segments(self, monitor: str) -> list[str]:
        """Paths of one monitor's segments, oldest first."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.monitor_dir(monitor), allow_not_found=True))
        except FileNotFoundError:
            return []
        found = [
            (i, info.path)
            for info in infos
            if info.type == pafs.FileType.Directory and (i := segment_index(info.base_name)) is not None
        ]
        return [p for _, p in sorted(found)]

    def monitors(self) -> list[str]:
        """Names of the monitors that have at least one segment here."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except FileNotFoundError:
            return []
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and self.segments(i.base_name))

    def claim_segment(self, monitor: str, link: dict[str, Any]) -> tuple[str, Path]:
        """Claim the next free segment of `monitor`; return (its path in the store, the local
        folder the monitor writes to). The link (see segment_link) is written as `segment.json`."""
        taken = [segment_index(posixpath.basename(p)) or 0 for p in self.segments(monitor)]
        index = max(taken, default=-1) + 1
        if self.is_local:
            Path(self.monitor_dir(monitor)).mkdir(parents=True, exist_ok=True)
            while True:
                path = posixpath.join(self.monitor_dir(monitor), segment_name(index))
                try:
                    os.mkdir(path)  # atomic: two claimants never get the same folder
                    break
                except FileExistsError:
                    index += 1
            local = Path(path)
        else:
            path = posixpath.join(self.monitor_dir(monitor), segment_name(index))
            local = Path(tempfile.mkdtemp(prefix=f"ray-ormas-{monitor}-{segment_name(index)}-"))
        link = {**link, "segment": index}
        (local / SEGMENT_FILE).write_text(json.dumps(link, indent=1, sort_keys=True) + "\n")
        if not self.is_local:
            self.filesystem.create_dir(path, recursive=True)
            self.write_bytes(posixpath.join(path, SEGMENT_FILE), (local / SEGMENT_FILE).read_bytes())
        return path, local

    # ------------------------------------------------------------------ files
    def download(self, path: str, local_dir: Path) -> Path:
        """Copy the folder `path` of this store into `local_dir`; return `local_dir`. A file sent
        in parts (record/uploads.py) arrives whole."""
        local_dir.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(
            path, str(local_dir), source_filesystem=self.filesystem, destination_filesystem=pafs.LocalFileSystem()
        )
        for parts in sorted(local_dir.glob(f"*{PARTS_SUFFIX}")):
            whole = local_dir / str(whole_name(parts.name))
            if parts.is_dir() and not whole.exists():
                whole.write_bytes(join_parts((p.name, p.read_bytes()) for p in parts.iterdir() if p.is_file()))
            shutil.rmtree(parts, ignore_errors=True)
        return local_dir

    def read_bytes(self, path: str) -> bytes | None:
        """The file at `path`; put together from its parts (record/uploads.py) if it has no whole copy
        yet; None if neither exists."""
        try:
            with self.filesystem.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:
            pass
        infos = self.filesystem.get_file_info(pafs.FileSelector(parts_folder(path), allow_not_found=True))
        parts = [i for i in infos if i.type == pafs.FileType.File]
        if not parts:
            return None
        read = []
        for info in parts:
            with self.filesystem.open_input_stream(info.path) as f:
                read.append((info.base_name, f.read()))
        return join_parts(read)

    def read_lines(self, path: str) -> list[dict[str, Any]]:
        """The JSON objects of a JSON-lines file (`json_lines`); [] if it does not exist."""
        return list(json_lines(self.read_bytes(path)))

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.filesystem.open_output_stream(path) as f:
            f.write(data)


STORAGE_ADVICE = (
    "The record goes beside the run's checkpoints (RunConfig.storage_path / storage_filesystem) unless "
    "RayOrmasTrainer(record_dir=...) says otherwise; point it at a location every node can write (a "
    "shared path such as /mnt/nfs/runs, or s3://bucket/runs with credentials in the environment)."
)
CREDENTIAL_SOURCES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


def storage_check_timeout_s() -> float:
    text = os.environ.get("RAY_ORMAS_STORAGE_CHECK_TIMEOUT_S", "20")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise RecordStorageError(f"RAY_ORMAS_STORAGE_CHECK_TIMEOUT_S={text!r}: give a number of seconds above 0")
    return value


def _endpoint_hint(filesystem: pafs.FileSystem) -> str:
    if filesystem.type_name != "s3":
        return ""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return (
        f" (is the endpoint {endpoint} right, and reachable from here?)"
        if endpoint
        else " (is this machine able to reach S3? For an S3-compatible store, set AWS_ENDPOINT_URL)"
    )


def _credentials_hint(filesystem: pafs.FileSystem) -> str:
    """For S3 without any credentials in sight: say so (the request went out unsigned)."""
    if filesystem.type_name != "s3" or any(os.environ.get(k) for k in CREDENTIAL_SOURCES):
        return ""
    if Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser().is_file():
        return ""
    return (
        " No AWS credentials were found (no AWS_ACCESS_KEY_ID, AWS_PROFILE, web identity token or "
        "~/.aws/credentials), so the request went unsigned unless this machine has an instance or pod role."
    )


def resolve(path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path on it) the way Ray Train resolves `storage_path` and `storage_filesystem`;
    a plain local path is made absolute (and `~` expanded)."""
    text = os.fspath(path)
    if filesystem is not None:
        if not isinstance(filesystem, pafs.FileSystem):
            raise OptionTypeError(
                f"storage_filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}"
            )
        if isinstance(filesystem, pafs.LocalFileSystem):
            text = os.path.abspath(os.path.expanduser(text))
        return filesystem, text
    if "://" not in text:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(text))
    try:
        fs, fs_path = pafs.FileSystem.from_uri(text)
    except Exception as e:
        raise RecordStorageError(
            f"pyarrow cannot open the storage URI {text!r} ({type(e).__name__}: {e}); use a scheme pyarrow knows "
            f"(file, s3, gs, hdfs) or pass RunConfig(storage_filesystem=...) with a path on it"
        ) from None
    return fs, fs_path
