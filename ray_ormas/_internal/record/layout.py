"""The record's layout: every folder, file name and key of the record and the fleet record, the
`.parts` format of files sent in parts, and which monitor names the layout reserves. The one owner
of these names: every other module takes them from here.

    <storage_path>/<run name>/ormas/              RECORD_DIR, beside Ray's checkpoints
      <monitor>/                                  one folder per monitor (DEFAULT_MONITOR_NAME: "model")
        segment-000/                              one per attempt (segment_name), claimed by rank 0
          segment.json                            SEGMENT_FILE: the link between segments (segments.py)
          diary.jsonl, metrics.jsonl              DIARY, METRICS: ormas-monitor's hash-chained files
          report.html, ...                        REPORT: ormas-monitor's reports, at the end
          diary.jsonl.parts/0000000000000000      on object storage, a file still open: sent in parts
      fleet/<fit id>/                             FLEET_DIR: fleet.json, checks.jsonl, alarms.jsonl, attempts.jsonl,
                                                  actions.jsonl, stacks.jsonl, preflight.jsonl
      goodput/<fit id>.json                       GOODPUT_DIR: the fit's timeline, for its goodput account
      run.html                                    RUN_PAGE: the run on one page (driver/run_page.py)
      .mlflow/<fit id>.json                       JOURNAL_DIR: the fit's MLflow journal (tracking/sync.py)

A checkpoint's Ray metadata holds the record pointer under CHECKPOINT_KEY. Plain Python.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator

from ray_ormas.errors import OptionError

RECORD_DIR = "ormas"
DEFAULT_MONITOR_NAME = "model"
SEGMENT = re.compile(r"^segment-(\d{3,})$")
SEGMENT_FILE = "segment.json"
SEGMENT_FORMAT = "ray-ormas-segment"
DIARY = "diary.jsonl"
METRICS = "metrics.jsonl"
REPORT = "report.html"
RUN_PAGE = "run.html"
FLEET_DIR = "fleet"
FLEET_META = "fleet.json"
FLEET_CHECKS = "checks.jsonl"
FLEET_ALARMS = "alarms.jsonl"
FLEET_ATTEMPTS = "attempts.jsonl"
FLEET_ACTIONS = "actions.jsonl"
FLEET_STACKS = "stacks.jsonl"
FLEET_PREFLIGHT = "preflight.jsonl"
JOURNAL_DIR = ".mlflow"
GOODPUT_DIR = "goodput"  # goodput/<fit id>.json: each fit's timeline (record/fit_timeline.py)
PARTS_SUFFIX = ".parts"
CHECKPOINT_KEY = "ormas"
# Folders of the record root that are not monitors: a monitor may not be named so.
RESERVED_MONITOR_NAMES = frozenset({FLEET_DIR, GOODPUT_DIR})


def segment_name(index: int) -> str:
    return f"segment-{index:03d}"


def segment_index(name: str) -> int | None:
    m = SEGMENT.match(name)
    return int(m.group(1)) if m else None


def check_monitor_name(name: Any) -> str:
    """A monitor name becomes a folder of the record: letters, digits, '-', '_' and '.' only, not
    starting with '.', and none the layout reserves for its own folders."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or not all(c.isalnum() or c in "-_." for c in name)
    ):
        raise OptionError(
            f"monitor name must be a non-empty folder name of letters, digits, '-', '_' or '.', got {name!r}"
        )
    if name in RESERVED_MONITOR_NAMES:
        raise OptionError(
            f"monitor name {name!r} is reserved: the record keeps its {name}/ folder there "
            f"(reserved: {sorted(RESERVED_MONITOR_NAMES)}); choose another name, e.g. {name + '-model'!r}"
        )
    return name


def json_lines(data: bytes | None) -> Iterator[dict[str, Any]]:
    """The JSON objects of JSON-lines bytes, the one reader of record files in the package. A line
    that is not a JSON object (an empty tail, a line cut short by a crash) is skipped."""
    for raw in (data or b"").split(b"\n"):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            yield line


def part_name(offset: int) -> str:
    """The name of the part of a file that starts at byte `offset` (record/uploads.py)."""
    return f"{offset:016d}"


def parts_folder(name: str) -> str:
    """The folder that holds file `name`'s parts while it is sent in parts."""
    return name + PARTS_SUFFIX


def whole_name(folder: str) -> str | None:
    """The file whose parts folder `folder` is; None when it is no parts folder."""
    return folder[: -len(PARTS_SUFFIX)] if folder.endswith(PARTS_SUFFIX) else None


def join_parts(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """A file from its parts, each placed at the offset its name gives; stops at a gap."""
    whole = bytearray()
    for name, data in sorted(parts, key=lambda p: int(p[0]) if p[0].isdigit() else -1):
        if not name.isdigit():
            continue
        offset = int(name)
        if offset > len(whole):
            break
        whole[offset : offset + len(data)] = data
    return bytes(whole)
