"""How the segments of one monitor's record are linked, and where a checkpoint points into them.

Every segment folder holds a `segment.json` written when rank 0 claims it, before training:

    {"format": "ray-ormas-segment", "version": 1, "monitor": "model", "segment": 1,
     "run_name": "...", "fit_id": "...", "attempt": 1, "world_size": 2, "started": 1795975967.3,
     "previous": {"segment": "segment-000", "last_hash": "<sha256 of its last diary line>",
                  "events": 41, "complete": false},
     "resumed_from": {"checkpoint": "<path>", "record": {<the pointer below>}},
     "step_offset": 300, "strategy": "ddp", "batch": null, "metric_prefix": "ormas"}

`previous` names the segment before it and the hash its diary ended on (as persisted), so the
chain of segments can be checked the way ormas-monitor checks the chain of lines inside one;
`complete` is false when that segment has no `run_end` (its attempt crashed). `attempt` counts
worker-group starts within one `fit()` (`fit_id`); a rerun under the same name starts at 0 again.
`step_offset` is the optimizer step the segment starts at: the resumed checkpoint's step, else 0;
a segment's `step + step_offset` is the step of the whole run. `metric_prefix` is the prefix of
the monitor's MLflow metrics (`ormas` for the first monitor, `ormas/<name>` for the others), so
`ray-ormas mlflow-sync` names the rows as they were named live.

A checkpoint reported through `ray_ormas.report(..., checkpoint=...)` gets, in its Ray metadata
(`Checkpoint.get_metadata()["ormas"]`), one pointer per monitor: the segment, how many diary
lines and metrics rows it held when the checkpoint was taken, and the hash of its last line. The
record is append-only, so that prefix is exactly the record as of the checkpoint.

`segment.json` is a sidecar: ormas-monitor's verify and seal cover `diary.jsonl` and
`metrics.jsonl` and ignore it, and its event schema has no event type to carry the link.
"""

from __future__ import annotations

import json
import posixpath
import time
from typing import Any

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.layout import CHECKPOINT_KEY, DIARY, SEGMENT_FILE, SEGMENT_FORMAT, json_lines
from ray_ormas._internal.record.store import RecordStore

logger = get_logger("ray_ormas.record")

LINK_VERSION = 1


def diary_tail(data: bytes | None) -> dict[str, Any]:
    """Events, last hash, completeness of a diary's bytes, and the error its `run_end` carries
    (the loop raised; None when it returned, or when there is no run_end). A line cut short by a
    crash (no newline, or not JSON) is not counted."""
    events, last_hash, last = 0, None, {}
    for line in json_lines(data):
        if isinstance(line.get("hash"), str):
            events, last_hash, last = events + 1, line["hash"], line
    complete = last.get("event") == "run_end"
    error = last.get("error") if complete else None
    return {"events": events, "last_hash": last_hash, "complete": complete, "error": error}


def segment_link(
    store: RecordStore,
    monitor: str,
    *,
    run_name: str,
    fit_id: str,
    attempt: int,
    world_size: int,
    resumed_from: dict[str, Any] | None,
) -> dict[str, Any]:
    """The link of the segment about to be claimed (everything but its own index)."""
    previous = None
    earlier = store.segments(monitor)
    if earlier:
        last = earlier[-1]
        tail = diary_tail(store.read_bytes(posixpath.join(last, DIARY)))
        previous = {
            "segment": posixpath.basename(last),
            **{k: tail[k] for k in ("events", "last_hash", "complete")},
        }
    pointer = ((resumed_from or {}).get("record") or {}).get(monitor) or {}
    return {
        "format": SEGMENT_FORMAT,
        "version": LINK_VERSION,
        "monitor": monitor,
        "run_name": run_name,
        "fit_id": fit_id,
        "attempt": attempt,
        "world_size": world_size,
        "started": round(time.time(), 3),
        "previous": previous,
        "resumed_from": (
            {"checkpoint": resumed_from.get("checkpoint"), "record": pointer or None} if resumed_from else None
        ),
        "step_offset": int(pointer.get("run_steps", 0)),
    }


def read_link(store: RecordStore, segment_path: str) -> dict[str, Any]:
    """A segment's `segment.json`, or {} for a segment written without one."""
    data = store.read_bytes(posixpath.join(segment_path, SEGMENT_FILE))
    try:
        link = json.loads(data) if data else {}
    except ValueError:
        return {}
    return link if isinstance(link, dict) else {}


def event_step(line: dict[str, Any], last_step: int) -> int:
    """The step of a diary event in the segment: its own, else its `steps` (run_end), else the step
    of the last event before it that had one (run_start: 0). The same rule live and from the record."""
    for key in ("step", "steps"):
        value = line.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return last_step


def record_pointer(checkpoint: Any) -> dict[str, Any] | None:
    """The record pointer in a checkpoint's Ray metadata (`CHECKPOINT_KEY`); None when it has none.
    Metadata that cannot be read is said (one warning) and taken as none: the checkpoint still
    resumes, and the record's new segment is then not linked to the one it continues."""
    try:
        metadata = checkpoint.get_metadata()
    except Exception as e:
        logger.warning(
            "could not read the metadata of checkpoint %s (%s: %s); it is used without a record "
            "pointer, so the record's next segment is not linked to the one it continues",
            getattr(checkpoint, "path", checkpoint),
            type(e).__name__,
            e,
        )
        return None
    pointer = metadata.get(CHECKPOINT_KEY) if isinstance(metadata, dict) else None
    return pointer if isinstance(pointer, dict) else None
