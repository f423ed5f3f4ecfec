"""The tracking journal's schema: a typed, versioned model of what a fit's MLflow run should hold
beyond the record.

One journal per fit, at `<record root>/.mlflow/<fit_id>.json`. The head node's MLflow writer
(head/mlflow_writer.py) keeps it up to date in the run's storage; `tracking/sync.py` brings the
MLflow run up to it at every attempt's end, the fit's end and `ray-ormas mlflow-sync`; the run's
page (driver/run_page.py) charts its loop metrics. Reading it goes through `parse_journal`:

* a file whose `format` is not `ray-ormas-mlflow` is not a journal and is passed over;
* a `version` this ray-ormas does not know (a newer one wrote it) is a `JournalError` that names
  the file and both versions, never a `KeyError` half-way through a sync;
* every older version is read (so far there is one: version 1, written since the journal
  exists; a new version adds its reader of the old ones here, in `_upgrade`). A field added
  with a default keeps the version (an older reader ignores it, this one defaults it when
  absent, as `closed_by`); a change an older reader would misread takes a new version;
* a journal whose fields do not validate is a `JournalError` naming the file and the fields.

JSON keeps NaN and Infinity as Python's `json` writes them (a loss can be NaN), so the model is
dumped to a dict and written with `json`, not with pydantic's JSON (which writes NaN as null).

Hooks relied on: pydantic v2's `BaseModel`, `model_validate`, `model_dump` and `model_copy`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ray_ormas.errors import JournalError

JOURNAL_FORMAT: Literal["ray-ormas-mlflow"] = "ray-ormas-mlflow"
JOURNAL_VERSION = 1  # what this ray-ormas writes
READABLE_VERSIONS = (1,)  # what it reads
ADDED_SINCE_VERSION_1 = ("closed_by",)  # optional fields an older ray-ormas neither writes nor reads


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JournalReport(_Part):
    """One `ray_ormas.report` of rank 0: its MLflow-ready loop metrics at its run step."""

    step: int
    attempt: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)


class JournalCheckpoint(_Part):
    """One reported checkpoint: where it is, the record pointer in its metadata, its metrics."""

    step: int
    path: str
    record: dict[str, Any] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    def metric(self, name: str) -> float | None:
        """The value of `name` when it is a number that can be ranked (not NaN)."""
        value = self.metrics.get(name)
        return None if value is None or math.isnan(value) else value


class TrackingJournal(_Part):
    """The tracking journal of one fit (see the module docstring). Mutable: the writer appends to
    it as reports arrive and writes it whole each time."""

    format: Literal["ray-ormas-mlflow"] = JOURNAL_FORMAT
    version: int = JOURNAL_VERSION
    fit_id: str
    run_name: str
    tracking_uri: str
    experiment: str
    mlflow_run_name: str
    tags: dict[str, str] = Field(default_factory=dict)
    params: dict[str, str] = Field(default_factory=dict)
    truncated_params: list[str] = Field(default_factory=list)
    run_id: str | None = None
    continued: bool = False  # the fit continues a run id it was given
    status: str | None = None  # FINISHED, FAILED or KILLED once the fit ended
    error: str | None = None
    closed_by: str | None = None  # who closed a fit that never reached its end, and why (`mlflow-sync`)
    final_checkpoint: str | None = None
    log_checkpoints: Literal["none", "last", "best", "all"] = "none"
    checkpoint_metric: str | None = None
    checkpoint_mode: Literal["min", "max"] = "min"
    reports: list[JournalReport] = Field(default_factory=list)
    skipped_metrics: list[str] = Field(default_factory=list)
    checkpoints: list[JournalCheckpoint] = Field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        """The journal as `json.dumps` takes it (NaN kept as NaN). Fields added since version 1
        are left out while unset, so a journal is written as the ray-ormas that began it wrote it."""
        data = self.model_dump(mode="python")
        for name in ADDED_SINCE_VERSION_1:
            if data.get(name) is None:
                data.pop(name, None)
        return data


def parse_journal(data: object, where: str) -> TrackingJournal | None:
    """The journal in `data` (a file's parsed JSON, `where` its path for messages); None when
    `data` is not a ray-ormas journal. Raises JournalError for a version this ray-ormas does not
    read or for fields that do not validate."""
    if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
        return None
    version = data.get("version")
    if version not in READABLE_VERSIONS:
        raise JournalError(
            f"the MLflow journal {where} has version {version!r}, which this ray-ormas does not read "
            f"(it reads version {', '.join(map(str, READABLE_VERSIONS))}): a newer ray-ormas wrote it. "
            "Install that ray-ormas (or a newer one) where you run this, then run it again"
        )
    try:
        return TrackingJournal.model_validate(_upgrade(data))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(the whole file)'}: {err['msg']}" for err in e.errors()[:5]
        )
        raise JournalError(
            f"the MLflow journal {where} is damaged ({problems}). The record itself is not affected; "
            "move the file aside to sync the run's other fits, or restore it from a backup"
        ) from None


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A journal of any readable version as the current version's fields (version 1 is current)."""
    return {**data, "version": JOURNAL_VERSION}
