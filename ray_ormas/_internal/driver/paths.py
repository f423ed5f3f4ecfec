"""Storage locations a user gives, resolved on the driver before Ray sees them.

Ray Train hands `RunConfig.storage_path` to `pyarrow.fs.FileSystem.from_uri` inside its
controller actor, which refuses a relative path ("URI has empty scheme") only after the cluster
and the controller have started, with a stack of Ray internals. So every storage location a user
gives (`RunConfig(storage_path=...)`, `record_dir=`, and the CLI's `storage.path` and
`storage.record_dir`) is resolved here, on the driver:

* `~` is expanded and a relative path is made absolute against the driver's working directory;
  the caller says so in its progress output (`ResolvedLocation.note`);
* under `ray job submit` a relative path is refused: the job's working directory is a temporary
  copy that Ray deletes when the job ends, so the run would vanish with it;
* a URI's scheme must be one pyarrow opens (what Ray Train itself uses), and a local path whose
  parent folder does not exist is refused (a typo would otherwise grow a stray tree), as is a
  path that names a file.

Errors are `StoragePathError` (a `RecordStorageError`, so a `ValueError`), whose message names
the key it was given under and says what to write instead.

Hooks relied on: `RAY_JOB_CONFIG_JSON_ENV_VAR`, which Ray's job supervisor sets in the
environment of a submitted job's entrypoint (ray/dashboard/modules/job/job_supervisor.py), and
the URI schemes of `pyarrow.fs.FileSystem.from_uri`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ray_ormas._internal.seams.ray_train import job_config_env
from ray_ormas.errors import StoragePathError

PYARROW_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "mock")
INSTEAD = (
    "an absolute path every node can reach (/mnt/shared/runs), a path in the home folder "
    "(~/ray_ormas_runs), or a URI (s3://bucket/runs)"
)


@dataclass(frozen=True)
class ResolvedLocation:
    """A storage location as given and as Ray will get it.

    Attributes:
        given: the value as the user wrote it.
        location: an absolute local path, or the URI unchanged.
        note: one line for the progress output when the value was rewritten (None otherwise).
    """

    given: str
    location: str
    note: str | None = None


def submitted_job_working_dir() -> str | None:
    """Under `ray job submit`: the job's `--working-dir` as submitted ("" when none was given);
    None when this process is not a submitted job's entrypoint."""
    raw = os.environ.get(job_config_env())  # Ray's job supervisor sets it (checked in seams/ray_train.py)
    if raw is None:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return ""
    return str(runtime_env.get("working_dir") or "")


def resolve_location(value: str | os.PathLike, key: str) -> ResolvedLocation:
    """Resolve a storage location given under `key` (e.g. "storage.path"), or raise
    StoragePathError naming the key, the value and what to write instead."""
    given = os.fspath(value)
    if not isinstance(given, str) or not given.strip():
        raise StoragePathError(f"{key} is empty: give {INSTEAD}")
    if "://" in given:
        scheme = given.split("://", 1)[0].lower()
        if scheme not in PYARROW_SCHEMES:
            raise StoragePathError(
                f"{key}: {given!r} has the scheme {scheme!r}, which pyarrow (and so Ray Train) cannot open; use "
                f"one of {', '.join(s + '://' for s in PYARROW_SCHEMES)}, or a local path"
            )
        return ResolvedLocation(given, given)
    expanded = os.path.expanduser(given)
    note = None
    if not os.path.isabs(expanded):
        job_dir = submitted_job_working_dir()
        if job_dir is not None:
            where = (
                "a temporary copy of --working-dir that Ray deletes when the job ends"
                if job_dir
                else "the job agent's folder on the head node"
            )
            raise StoragePathError(
                f"{key}: {given!r} is a relative path, and this runs under `ray job submit`, whose working "
                f"directory is {where}: the run would be lost. Use {INSTEAD}"
            )
        absolute = os.path.abspath(expanded)
        note = f"{key} {given!r} is relative to this directory: the run goes to {absolute}"
    else:
        absolute = os.path.normpath(expanded)
        if expanded != given:
            note = f"{key} {given!r} is {absolute}"
    parent = os.path.dirname(absolute)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise StoragePathError(f"{key}: {given!r}: {parent} is a file, not a folder; choose a folder: {INSTEAD}")
    if not os.path.isdir(parent):
        raise StoragePathError(
            f"{key}: {given!r}: its parent folder {parent} does not exist (a typo?); create it first "
            f"(mkdir -p {parent}) or choose another location: {INSTEAD}"
        )
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        raise StoragePathError(f"{key}: {given!r} is a file, not a folder; choose a folder: {INSTEAD}")
    return ResolvedLocation(given, absolute, note)
