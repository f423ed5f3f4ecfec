"""A fit's timeline: when each attempt began, trained, checked and ended, on the head node's clock.

The run ledger keeps it (head/goodput_keeper.py) from events it already sees: the fit's start
(the driver's `fit()` call), each attempt's check-in, rank 0's clock at every check
(`ClockReading`, worker/step_clock.py), the controller's report of a failed attempt, the fleet's
alarms and actions, and the fit's end. It is written whole, as one small JSON file per fit,
`ormas/goodput/<fit id>.json`, at each attempt's start and end, at most once a minute in
between, and at the end; the goodput account (record/goodput.py) is computed from it alone, so
`ray-ormas goodput RUN` reads any record on any storage. Pure Python, no Ray, no torch.

Hooks relied on: none.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ray_ormas._internal.record.layout import GOODPUT_DIR
from ray_ormas._internal.record.store import RecordStore
from ray_ormas.errors import RecordStorageError

TIMELINE_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClockReading:
    """Rank 0's clock of its main monitor, sent at every check and at the loop's end.

    Every figure counts from the moment the monitor was attached (the first step begins) on the
    worker's own monotonic clock; the head places them on its clock by the time a reading
    arrives. `compute_s` is the steps' own time: each step's wall time less its data wait, the
    monitor's work and the reports in it."""

    elapsed_s: float  # since the monitor was attached
    steps: int  # optimizer steps taken (the segment's)
    compute_s: float
    data_s: float  # from the optimizer step's end (or the monitor's step) to the next forward pass
    monitor_s: float  # inside the monitor's step: its checks, the fleet's probe, the row on disk
    report_s: float  # inside ray-ormas reports: the meeting, the record's upload, Ray's report and checkpoint
    step_s: float | None  # the median step (compute) time since the previous reading
    first_steps: int  # the steps up to the first reading (the warm-up window)
    first_compute_s: float  # their compute time
    ended: bool = False  # the loop's end: the attempt's last reading
    closing_s: float = 0.0  # at the loop's end: the final meeting and the record's close
    # The first step's own (compute, data wait, monitor) seconds: its one-offs (the loop's set-up
    # after the attach, the loader's start, the first check) are no part of a steady step. None in
    # records written before it was sent.
    first_step: tuple[float, float, float] | None = None


@dataclass
class AttemptTimes:
    """One worker-group attempt on the head's clock (Unix seconds), as the keeper builds it."""

    attempt: int
    world: int | None = None
    step_offset: int = 0  # the run step its first step takes
    checked_in: float | None = None  # rank 0's session began (the worker group is up)
    clock_at: float | None = None  # its first step began (rank 0's monitor attached)
    seen_at: float | None = None  # its last reading arrived
    reading: dict[str, Any] | None = None  # the last ClockReading, as a dict
    steady_s: float | None = None  # the steady step time: the median of the readings' medians after the first
    held_data_s: float = 0.0  # the slowest rank's data wait beyond the median rank's (fleet health)
    check_every_s: float | None = None  # the median time between two readings
    failed_seen_at: float | None = None  # a surviving rank saw the failure (its loop raised)
    failed_steps: int | None = None  # the most steps a rank had taken then
    ended_at: float | None = None  # the controller saw it fail
    cause: str | None = None  # why it ended: see record/goodput.py
    alarm_at: float | None = None  # the fleet alarm whose action ended it
    error: str | None = None  # the first failing rank's error, cut short


@dataclass
class FitTimeline:
    """One fit's timeline: its start, its attempts, and its close (None while it runs)."""

    fit_id: str
    run_name: str | None
    started: float
    attempts: list[AttemptTimes] = field(default_factory=list)
    closed: float | None = None  # the driver's wind-down (MLflow's and run.html's account end here)
    returned: float | None = None  # fit() returned (the record's and the result's account end here)
    status: str | None = None  # FINISHED, FAILED or KILLED once closed
    version: int = TIMELINE_VERSION

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> FitTimeline:
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise RecordStorageError(f"{where} is not a goodput timeline ({e}); delete it or keep it aside") from e
        version = raw.get("version") if isinstance(raw, dict) else None
        if version != TIMELINE_VERSION:
            raise RecordStorageError(
                f"{where} has timeline version {version!r}, and this ray-ormas reads version "
                f"{TIMELINE_VERSION}; read it with the ray-ormas that wrote it, or upgrade"
            )
        names = {f.name for f in fields(AttemptTimes)}
        attempts = [AttemptTimes(**{k: v for k, v in a.items() if k in names}) for a in raw.get("attempts") or []]
        top = {f.name for f in fields(cls)} - {"attempts"}
        return cls(**{k: v for k, v in raw.items() if k in top}, attempts=attempts)


def timeline_path(store: RecordStore, fit_id: str) -> str:
    return posixpath.join(store.root, GOODPUT_DIR, f"{fit_id}.json")


def write_timeline(store: RecordStore, timeline: FitTimeline) -> None:
    """The timeline, written whole (object storage replaces it in one request)."""
    path = timeline_path(store, timeline.fit_id)
    if store.is_local:
        store.filesystem.create_dir(posixpath.dirname(path), recursive=True)
    store.write_bytes(path, timeline.to_json())


def read_timeline(store: RecordStore, fit_id: str) -> FitTimeline | None:
    """One fit's timeline (None: it kept none)."""
    path = timeline_path(store, fit_id)
    data = store.read_bytes(path)
    return FitTimeline.from_json(data, store.shown(path)) if data else None


def last_run_step(timeline: FitTimeline) -> int:
    """The run step of the fit's latest reading (where its goodput is logged in MLflow)."""
    return max(
        (a.step_offset + int((a.reading or {}).get("steps") or 0) for a in timeline.attempts if a.reading), default=0
    )


def read_timelines(store: RecordStore) -> list[FitTimeline]:
    """Every fit's timeline under the record root, oldest fit first."""
    import pyarrow.fs as pafs

    folder = posixpath.join(store.root, GOODPUT_DIR)
    try:
        infos = store.filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    found = []
    for info in infos:
        if info.type == pafs.FileType.File and info.base_name.endswith(".json"):
            data = store.read_bytes(info.path)
            if data:
                found.append(FitTimeline.from_json(data, store.shown(info.path)))
    return sorted(found, key=lambda t: t.started)
