"""Reading a run's records back from its storage: every segment of every monitor, as Arrow tables.

    records = ray_ormas.open_records("s3://bucket/runs/digits")   # the run folder, or its ormas/ folder
    records.segments()                  # one Segment per monitor and attempt, oldest first, with its link
    records.events()                    # pyarrow.Table: one row per diary line
    records.metrics()                   # pyarrow.Table: one row per check
    records.fleet_checks()              # pyarrow.Table: one row per rank per check kept (fleet health)
    records.fleet_summaries()           # pyarrow.Table: one row per check: quantiles, outlier ranks
    records.fleet_alarms()              # pyarrow.Table: one row per fleet alarm
    records.fleet_attempts()            # pyarrow.Table: one row per attempt: world size, resize or not
    records.fleet_actions()             # pyarrow.Table: one row per action an alarm asked for
    records.fleet_preflight()           # pyarrow.Table: one row per rank per attempt screened before its first step
    records.write_parquet("out/")       # out/events.parquet, out/metrics.parquet, out/fleet_*.parquet
    records.rebuild_reports("local/")   # each segment copied here, its HTML reports rebuilt, verified

Both tables carry `monitor`, `segment`, `attempt`, `fit_id`, the segment's own `step` and
`run_step` (= step + the segment's `step_offset`, the step of the whole run across resumes).
Rows of a segment cut short by a crash are read up to the last complete line.

Hooks relied on: `pyarrow.fs` (any filesystem, as record/store.py resolves it), ormas-monitor's
`report.write_all` and `record.verify.verify_run` for the reports and the verdicts (never
re-implemented here).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ray_ormas._internal.record.fit_timeline import read_timelines
from ray_ormas._internal.record.fleet_record import (
    fleet_fits,
    read_fleet,
    read_fleet_actions,
    read_fleet_attempts,
    read_fleet_preflight,
    read_fleet_table,
)
from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE, SUMMARIES_TABLE, plain_schema
from ray_ormas._internal.record.goodput import GoodputAccount, account_of, combined
from ray_ormas._internal.record.layout import DIARY, METRICS, RECORD_DIR, segment_index
from ray_ormas._internal.record.run_facts import run_facts
from ray_ormas._internal.record.segments import diary_tail, read_link
from ray_ormas._internal.record.store import RecordStorageError, RecordStore

EVENTS_SCHEMA = pa.schema(
    [
        ("monitor", pa.string()),
        ("segment", pa.int32()),
        ("attempt", pa.int32()),
        ("fit_id", pa.string()),
        ("seq", pa.int64()),
        ("event", pa.string()),
        ("step", pa.int64()),
        ("run_step", pa.int64()),
        ("time", pa.float64()),
        ("severity", pa.string()),
        ("layer", pa.string()),
        ("hash", pa.string()),
        ("line", pa.string()),
    ]
)
METRICS_SCHEMA = pa.schema(
    [
        ("monitor", pa.string()),
        ("segment", pa.int32()),
        ("attempt", pa.int32()),
        ("fit_id", pa.string()),
        ("step", pa.int64()),
        ("run_step", pa.int64()),
        ("loss", pa.float64()),
        ("grad", pa.map_(pa.string(), pa.float64())),
        ("stuck", pa.map_(pa.string(), pa.list_(pa.int64()))),
    ]
)
FLEET_CHECKS_SCHEMA = pa.schema(
    [
        ("fit_id", pa.string()),
        ("attempt", pa.int32()),
        ("check", pa.int64()),
        ("step", pa.int64()),
        ("run_step", pa.int64()),
        ("time", pa.float64()),
        ("rank", pa.int32()),
        ("node", pa.string()),
        ("data_s", pa.float64()),
        ("forward_s", pa.float64()),
        ("wall_s", pa.float64()),
        ("timed_steps", pa.int64()),
        ("loss", pa.float64()),
        ("nonfinite", pa.bool_()),
        ("digest", pa.string()),
        ("relative_score", pa.float64()),
        ("individual_score", pa.float64()),
        ("slow", pa.bool_()),
        ("slow_in", pa.string()),
    ]
)
FLEET_ATTEMPTS_SCHEMA = pa.schema(
    [
        ("fit_id", pa.string()),
        ("attempt", pa.int32()),
        ("world_size", pa.int32()),
        ("run_step", pa.int64()),
        ("time", pa.float64()),
        ("event", pa.string()),
        ("resized_from", pa.int32()),
    ]
)
FLEET_PREFLIGHT_SCHEMA = pa.schema(
    [
        ("fit_id", pa.string()),
        ("attempt", pa.int32()),
        ("rank", pa.int32()),
        ("node", pa.string()),
        ("node_id", pa.string()),
        ("device", pa.string()),
        ("compute_s", pa.float64()),
        ("flops", pa.float64()),
        ("compute_peers_s", pa.float64()),
        ("link_s", pa.float64()),
        ("link_peers_s", pa.float64()),
        ("allreduce_s", pa.float64()),
        ("bytes_per_s", pa.float64()),
        ("seconds", pa.float64()),
        ("slow", pa.bool_()),
        ("why", pa.string()),
        ("broken", pa.string()),  # probe -> why, as JSON ("{}": none)
        ("facts", pa.string()),  # probe -> the facts it returned, as JSON
        ("note", pa.string()),  # the attempt's: why nothing was compared
    ]
)
FLEET_ALARMS_SCHEMA = pa.schema(
    [
        ("fit_id", pa.string()),
        ("attempt", pa.int32()),
        ("check", pa.int64()),
        ("step", pa.int64()),
        ("run_step", pa.int64()),
        ("time", pa.float64()),
        ("kind", pa.string()),
        ("ranks", pa.list_(pa.int32())),
        ("node", pa.string()),
        ("message", pa.string()),
        ("line", pa.string()),
    ]
)

FLEET_ACTIONS_SCHEMA = pa.schema(
    [
        ("fit_id", pa.string()),
        ("id", pa.int32()),
        ("attempt", pa.int32()),
        ("run_step", pa.int64()),
        ("time", pa.float64()),
        ("alarm", pa.string()),
        ("action", pa.string()),
        ("diagnose", pa.bool_()),
        ("ranks", pa.list_(pa.int32())),
        ("node", pa.string()),
        ("checkpoint", pa.string()),
        ("checkpoint_run_step", pa.int64()),
        ("outcome", pa.string()),
        ("reason", pa.string()),
        ("seconds", pa.float64()),
        ("line", pa.string()),
    ]
)


@dataclass(frozen=True)
class Segment:
    """One monitor's record of one attempt: its folder in the store and its link (segment.json)."""

    monitor: str
    index: int
    path: str
    link: dict[str, Any]
    events: int
    complete: bool  # its diary ends with run_end
    error: str | None = None  # the error its run_end carries: the loop raised (None: it returned, or no run_end)

    @property
    def loop_ended(self) -> bool:
        """The loop returned on rank 0 and the monitor closed: a run_end without an error."""
        return self.complete and self.error is None

    @property
    def attempt(self) -> int | None:
        return self.link.get("attempt")

    @property
    def step_offset(self) -> int:
        return int(self.link.get("step_offset") or 0)


@dataclass(frozen=True)
class SegmentReport:
    """What `rebuild_reports` made of one segment."""

    segment: Segment
    local_dir: Path
    reports: dict[str, Path]
    verified: bool  # ormas-monitor's verify failed no check (but the missing run_end of a crashed one)
    problems: list[str]  # every failed check, "label: message"


def open_records(path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> RunRecords:
    """The records under a run folder (`<storage_path>/<name>`) or its `ormas` folder, on any
    filesystem pyarrow can open (a local path, `s3://...`, or `path` on `filesystem`)."""
    store = RecordStore.at(path, filesystem)
    nested = RecordStore(store.filesystem, posixpath.join(store.root, RECORD_DIR))
    for candidate in (nested, store):
        if candidate.monitors():
            return RunRecords(candidate)
    raise RecordStorageError(
        f"no ray-ormas record under {store.shown()}: expected <monitor>/segment-NNN/ folders "
        f"there or in its ormas/ folder. Give the run's folder (<storage_path>/<run name>) "
        f"or the record_dir the trainer used"
    )


class RunRecords:
    """Every segment of every monitor under one record root."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store

    def monitors(self) -> list[str]:
        return self.store.monitors()

    def segments(self, monitor: str | None = None) -> list[Segment]:
        """Segments oldest first, of one monitor or of all (grouped by monitor)."""
        out = []
        for name in [monitor] if monitor else self.monitors():
            for path in self.store.segments(name):
                tail = diary_tail(self.store.read_bytes(posixpath.join(path, DIARY)))
                out.append(
                    Segment(
                        monitor=name,
                        index=segment_index(posixpath.basename(path)) or 0,
                        path=path,
                        link=read_link(self.store, path),
                        events=tail["events"],
                        complete=tail["complete"],
                        error=tail["error"] if isinstance(tail["error"], str) else None,
                    )
                )
        return out

    def events(self, monitor: str | None = None) -> pa.Table:
        """One row per diary line, every segment; `line` is the whole line as JSON."""
        rows = []
        for seg, line in self._lines(monitor, DIARY):
            step = line.get("step") if isinstance(line.get("step"), int) else None
            rows.append(
                {
                    **_segment_columns(seg),
                    "seq": line.get("seq"),
                    "event": line.get("event"),
                    "step": step,
                    "run_step": None if step is None else step + seg.step_offset,
                    "time": line.get("time"),
                    "severity": _str(line.get("severity")),
                    "layer": _str(line.get("layer")),
                    "hash": line.get("hash"),
                    "line": json.dumps(line, sort_keys=True),
                }
            )
        return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)

    def metrics(self, monitor: str | None = None) -> pa.Table:
        """One row per check, every segment: loss, per-layer gradient norms, per-layer stuck channels."""
        rows = []
        for seg, row in self._lines(monitor, METRICS):
            step = row.get("step")
            rows.append(
                {
                    **_segment_columns(seg),
                    "step": step,
                    "run_step": None if step is None else step + seg.step_offset,
                    "loss": row.get("loss"),
                    "grad": list((row.get("grad") or {}).items()),
                    "stuck": list((row.get("stuck") or {}).items()),
                }
            )
        return pa.Table.from_pylist(rows, schema=METRICS_SCHEMA)

    def goodput(self) -> GoodputAccount | None:
        """Where the whole run's time went: every fit's goodput account (docs/goodput.md), summed
        over the run's fits (its continuations and reruns); None when no fit kept a timeline."""
        return combined(self.goodput_per_fit())

    def goodput_per_fit(self) -> list[GoodputAccount]:
        """Each fit's goodput account, oldest first (a fit that still runs: up to its last event)."""
        return [account_of(t) for t in read_timelines(self.store)]

    def fleets(self) -> list[str]:
        """The fit ids with a fleet record here (fleet health was on), oldest folder name first."""
        return fleet_fits(self.store)

    def fleet_checks(self) -> pa.Table:
        """Fleet health, every fit: one row per rank per check (timings, loss, digest, scores).
        Above `FleetSettings.record_ranks` ranks, only at the checks the record kept every rank's
        row of (`fleet_summaries()` says which: `full_rows`)."""
        return self._fleet_table(CHECKS_TABLE, FLEET_CHECKS_SCHEMA)

    def fleet_summaries(self) -> pa.Table:
        """Fleet health, every fit: one row per check, at any number of ranks: the fleet's and
        rank 0's loss, the quantiles (min, p10, p50, p90, max) of each timing and score, the
        slow, worst, non-finite and diverged ranks, and `full_rows` (whether `fleet_checks()`
        has every rank's row of it)."""
        return self._fleet_table(SUMMARIES_TABLE, pa.schema([("fit_id", pa.string()), *plain_schema(SUMMARIES_TABLE)]))

    def _fleet_table(self, table: str, schema: pa.Schema) -> pa.Table:
        tables = []
        for fit_id in self.fleets():
            t = read_fleet_table(self.store, fit_id, table)
            t = t.add_column(0, "fit_id", pa.array([fit_id] * t.num_rows, pa.string()))
            tables.append(t.select(schema.names).cast(schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def fleet_attempts(self) -> pa.Table:
        """Fleet health, every fit: one row per worker-group attempt, with its world size and
        first run step; `event` is "start", "restart" (same size) or "resize" (`resized_from`)."""
        rows = [
            {**{k: line.get(k) for k in FLEET_ATTEMPTS_SCHEMA.names}, "fit_id": fit_id}
            for fit_id in self.fleets()
            for line in read_fleet_attempts(self.store, fit_id)
        ]
        return pa.Table.from_pylist(rows, schema=FLEET_ATTEMPTS_SCHEMA)

    def fleet_actions(self) -> pa.Table:
        """Fleet health, every fit: one row per action an alarm asked for (`FleetSettings.actions`),
        with its outcome; `line` is the whole action as JSON, with the `stacks` a `diagnose`
        captured (rank -> text)."""
        rows = [
            {
                **{k: line.get(k) for k in FLEET_ACTIONS_SCHEMA.names},
                "fit_id": fit_id,
                "node": _str(line.get("node")),
                "line": json.dumps(line, sort_keys=True),
            }
            for fit_id in self.fleets()
            for line in read_fleet_actions(self.store, fit_id)
        ]
        return pa.Table.from_pylist(rows, schema=FLEET_ACTIONS_SCHEMA)

    def fleet_preflight(self) -> pa.Table:
        """The pre-flight screen, every fit: one row per rank per attempt screened before its first
        step, with its numbers, the median of the ranks on other nodes (`*_peers_s`), whether it
        was slow and why, and what broke (`broken`, probe -> why, as JSON)."""
        rows = [
            {
                **{k: row.get(k) for k in FLEET_PREFLIGHT_SCHEMA.names},
                "fit_id": fit_id,
                "broken": json.dumps(row.get("broken") or {}, sort_keys=True),
                "facts": json.dumps(row.get("facts") or {}, sort_keys=True),
                "note": screen.get("note"),
            }
            for fit_id in self.fleets()
            for screen in read_fleet_preflight(self.store, fit_id)
            for row in screen["rows"]
        ]
        return pa.Table.from_pylist(rows, schema=FLEET_PREFLIGHT_SCHEMA)

    def fleet_alarms(self) -> pa.Table:
        """Fleet health, every fit: one row per alarm; `line` is the whole alarm as JSON."""
        rows = []
        for fit_id in self.fleets():
            for line in read_fleet(self.store, fit_id)[2]:
                rows.append(
                    {
                        **{k: line.get(k) for k in FLEET_ALARMS_SCHEMA.names},
                        "fit_id": fit_id,
                        "node": _str(line.get("node")),
                        "line": json.dumps(line, sort_keys=True),
                    }
                )
        return pa.Table.from_pylist(rows, schema=FLEET_ALARMS_SCHEMA)

    def write_parquet(self, out_dir: str | os.PathLike, monitor: str | None = None) -> dict[str, Path]:
        """Write `events.parquet`, `metrics.parquet` and `segments.parquet` (one row per segment:
        its attempt, counts and state at its end, record/run_facts.py) into `out_dir` (a local
        folder), and `fleet_checks.parquet`, `fleet_summaries.parquet`, `fleet_alarms.parquet`,
        `fleet_attempts.parquet`, `fleet_actions.parquet` and `fleet_preflight.parquet` when there is
        a fleet record."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "events": out / "events.parquet",
            "metrics": out / "metrics.parquet",
            "segments": out / "segments.parquet",
        }
        pq.write_table(self.events(monitor), paths["events"])
        pq.write_table(self.metrics(monitor), paths["metrics"])
        rows = [
            seg.row()
            for name in ([monitor] if monitor else self.monitors())
            for seg in run_facts(self.store, name).segments
        ]
        pq.write_table(pa.Table.from_pylist(rows), paths["segments"])
        if self.fleets():
            paths.update(
                fleet_checks=out / "fleet_checks.parquet",
                fleet_summaries=out / "fleet_summaries.parquet",
                fleet_alarms=out / "fleet_alarms.parquet",
                fleet_attempts=out / "fleet_attempts.parquet",
                fleet_actions=out / "fleet_actions.parquet",
                fleet_preflight=out / "fleet_preflight.parquet",
            )
            pq.write_table(self.fleet_checks(), paths["fleet_checks"])
            pq.write_table(self.fleet_summaries(), paths["fleet_summaries"])
            pq.write_table(self.fleet_alarms(), paths["fleet_alarms"])
            pq.write_table(self.fleet_attempts(), paths["fleet_attempts"])
            pq.write_table(self.fleet_actions(), paths["fleet_actions"])
            pq.write_table(self.fleet_preflight(), paths["fleet_preflight"])
        return paths

    def rebuild_reports(self, out_dir: str | os.PathLike, monitor: str | None = None) -> list[SegmentReport]:
        """Copy every segment into `out_dir/<monitor>/segment-NNN/`, rebuild its HTML reports with
        ormas-monitor, and verify it. A crashed segment (no run_end) gets its reports too, and
        verify says what is missing."""
        from ormas_monitor.record.verify import verify_run
        from ormas_monitor.report import write_all

        out = Path(out_dir)
        done = []
        for seg in self.segments(monitor):
            local = self.store.download(seg.path, out / seg.monitor / posixpath.basename(seg.path))
            result = verify_run(local)
            failed = [c for c in result.checks if c.status == "fail"]
            # A crashed attempt's segment has no run_end; verify says so, and that alone is expected.
            unexpected = [c for c in failed if seg.complete or not (c.name == "bookends" and "no run_end" in c.message)]
            problems = [f"{c.label}: {c.message}" for c in failed]
            if not seg.complete:
                problems += _drop_cut_lines(local)
            done.append(
                SegmentReport(
                    segment=seg, local_dir=local, reports=write_all(local), verified=not unexpected, problems=problems
                )
            )
        return done

    def _lines(self, monitor: str | None, file: str) -> Iterator[tuple[Segment, dict[str, Any]]]:
        for seg in self.segments(monitor):
            for line in self.store.read_lines(posixpath.join(seg.path, file)):
                yield seg, line


def _drop_cut_lines(local: Path) -> list[str]:
    """In a local copy of a crashed segment, drop a last line the crash cut short: ormas-monitor's
    report cannot read it. Verification has already run on the copy as it was stored."""
    notes = []
    for name in (DIARY, METRICS):
        path = local / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        head, _, last = data.rstrip(b"\n").rpartition(b"\n")
        try:
            json.loads(last)
        except ValueError:
            if last.strip():
                path.write_bytes(head + b"\n" if head else b"")
                notes.append(
                    f"{name}: its last line was cut short by the crash and is left out of the rebuilt "
                    f"reports (the stored record is unchanged)"
                )
    return notes


def _segment_columns(seg: Segment) -> dict[str, Any]:
    return {"monitor": seg.monitor, "segment": seg.index, "attempt": seg.attempt, "fit_id": seg.link.get("fit_id")}


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
