"""The fleet record: what the head node concluded at every check, beside the monitors' segments.

Layout, under the record root (record/store.py), one folder per `fit()`:

    ormas/fleet/<fit id>/fleet.json      world size, strategy, settings, run name, the format's version
    ormas/fleet/<fit id>/summaries/      Parquet parts: one row per check (record/check_summaries.py)
    ormas/fleet/<fit id>/checks/         Parquet parts: every rank's row at the checks that keep them
                                         (all of them up to `FleetSettings.record_ranks` ranks)
    ormas/fleet/<fit id>/alarms.jsonl    one line per alarm: straggler, divergence, nonfinite, nccl_hang, ...
    ormas/fleet/<fit id>/attempts.jsonl  one line per worker-group attempt: its world size and first run
                                         step; `"event": "resize"` when an elastic fit's size changed
    ormas/fleet/<fit id>/actions.jsonl   one line per action an alarm asked for (fleet/actions.py), and
                                         one more when its outcome is known (`"event": "outcome"`)
    ormas/fleet/<fit id>/stacks.jsonl    the Python stacks a `diagnose` action captured, one line per rank
    ormas/fleet/<fit id>/preflight.jsonl the pre-flight screen (fleet/preflight.py): one line per rank per
                                         attempt, before its first step, and one `"event": "verdict"` line

The two tables grow by immutable Parquet parts (record/fleet_tables.py), written every
PART_EVERY_S, soon after an alarm, once PART_MAX_ROWS rows wait, and when the fit ends, on a thread
of their own. The JSON-lines files are append-only: on a local (or mounted) store the head
appends to them in place and flushes every line; on object storage it appends to a copy on the
head node and sends the new lines (record/uploads.py: soon after an alarm, else every
`UPLOAD_EVERY_S`, and whole when the fit ends). A rerun is another fit with its own folder, so
nothing a previous fit wrote is touched. Version 1 of the format (ray-ormas before the Parquet
tables) kept every rank's row in `checks.jsonl`; it is still read, its summaries computed.
`RunRecords.fleet_checks()`, `fleet_summaries()` and `fleet_alarms()` (record/reader.py) read every
fit's as Arrow tables; `fleet_summary` turns one fit's into the per-rank table of
`result.ormas.fleet` and of `ray-ormas report`.

Hooks relied on: `RecordStore` (pyarrow.fs), `pyarrow.parquet` (record/fleet_tables.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import posixpath
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.check_summaries import check_summary
from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE, SUMMARIES_TABLE, PartsWriter, plain_schema, read_table
from ray_ormas._internal.record.layout import (
    FLEET_ACTIONS,
    FLEET_ALARMS,
    FLEET_ATTEMPTS,
    FLEET_CHECKS,
    FLEET_DIR,
    FLEET_META,
    FLEET_PREFLIGHT,
    FLEET_STACKS,
)
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.record.uploads import IncrementalUpload
from ray_ormas.errors import RecordStorageError

UPLOAD_EVERY_S = 10.0
PART_EVERY_S = 30.0  # the check tables' rows go to a new Parquet part this often (and soon after an alarm)
PART_MAX_ROWS = 5000  # ... or once a table has this many rows waiting: the head's memory stays flat
FLEET_RECORD_VERSION = 2  # 2: `checks` and `summaries` as Parquet parts; 1: `checks.jsonl`
READABLE_FLEET_VERSIONS = (1, 2)  # a record's `fleet.json` "version" (absent: 1)
TABLES = (CHECKS_TABLE, SUMMARIES_TABLE)
logger = get_logger("ray_ormas.fleet")


def fleet_folder(store: RecordStore, fit_id: str) -> str:
    return posixpath.join(store.root, FLEET_DIR, fit_id)


class FleetRecordWriter:
    """Appends one fit's fleet lines to the record; a failed write is logged once, never raised."""

    def __init__(self, store: RecordStore, fit_id: str, meta: dict[str, Any]) -> None:
        self._store = store
        self.path = fleet_folder(store, fit_id)
        self._local = Path(self.path) if store.is_local else Path(tempfile.mkdtemp(prefix="ray-ormas-fleet-"))
        self._sync = None if store.is_local else IncrementalUpload(store, self._local, self.path)
        self._sync_lock = threading.Lock()
        self._dirty = threading.Event()
        self._urgent = threading.Event()
        self._closed = False
        self._failed = False
        self.bytes_written = 0
        try:
            self._local.mkdir(parents=True, exist_ok=True)
            (self._local / FLEET_META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        except OSError as e:
            self._fail(e)
        self._files = {name: self._open(name) for name in ("alarms", "attempts", "actions", "stacks", "preflight")}
        self._tables = {name: PartsWriter(store, self.path, name) for name in TABLES}
        self._parts_lock = threading.Lock()
        self._last_part = time.monotonic()
        if not store.is_local:
            self._dirty.set()
        self._thread = threading.Thread(target=self._uploader, name="ray-ormas-fleet-upload", daemon=True)
        self._thread.start()

    def _open(self, name: str) -> Any:
        try:
            return open(self._local / f"{name}.jsonl", "a", encoding="utf-8")
        except OSError as e:
            self._fail(e)
            return None

    def append(self, name: str, lines: list[dict[str, Any]], urgent: bool = False) -> None:
        """Lines for `name`: a JSON-lines file (written at once), or one of the Parquet tables
        (`checks`, `summaries`: written as a part every PART_EVERY_S, soon after `urgent`)."""
        table = self._tables.get(name)
        if table is not None:
            table.add(lines)
            if urgent or table.pending >= PART_MAX_ROWS:
                self._urgent.set()
            return
        f = self._files.get(name)
        if f is None or not lines:
            return
        try:
            text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
            f.write(text)
            f.flush()
            self.bytes_written += len(text.encode())
        except (OSError, ValueError) as e:
            self._fail(e)
            return
        self._dirty.set()
        if urgent:
            self._urgent.set()

    def close(self) -> None:
        """The fit ended: write the tables' last parts, close the files and upload them one last
        time (object storage)."""
        self._closed = True
        self._urgent.set()
        self._thread.join(timeout=UPLOAD_EVERY_S)
        if not self._write_parts():
            logger.warning(
                "the fleet record's last check rows (%s) could not be written to %s; the alarms and actions were",
                ", ".join(f"{t.pending} {name}" for name, t in self._tables.items() if t.pending),
                self._store.shown(self.path),
            )
        for f in self._files.values():
            if f is not None:
                f.close()
        if self._store.is_local:
            return
        if self._upload(final=True):
            shutil.rmtree(self._local, ignore_errors=True)
        else:
            logger.warning(
                "the fleet record could not be uploaded to %s when the fit ended; it is kept "
                "at %s on the head node: copy its files there when storage is back",
                self._store.shown(self.path),
                self._local,
            )

    def _uploader(self) -> None:
        _warm_arrow()
        while not self._closed:
            urgent = self._urgent.wait(UPLOAD_EVERY_S)
            self._urgent.clear()
            if self._closed:
                return
            if urgent or time.monotonic() - self._last_part >= PART_EVERY_S:
                self._write_parts()
            if self._dirty.is_set() and not self._store.is_local:
                self._upload()

    def _write_parts(self) -> bool:
        """A new part of each table that has rows (record/fleet_tables.py); False if storage refused
        (the rows wait for the next try)."""
        with self._parts_lock:
            self._last_part = time.monotonic()
            try:
                for table in self._tables.values():
                    table.flush()
            except Exception as e:  # retried at the next alarm, interval or the end
                self._fail(e)
                return False
            return True

    def _upload(self, final: bool = False) -> bool:
        """Send what is new (all of it, whole, when `final`); False if storage refused."""
        self._dirty.clear()
        try:
            with self._sync_lock:
                if self._sync is None:
                    return True
                if final:
                    self._sync.finish()
                else:
                    self._sync.push()
        except Exception as e:  # retried at the next alarm, interval or the end
            self._dirty.set()
            self._fail(e)
            return False
        return True

    def _fail(self, e: BaseException) -> None:
        if not self._failed:
            logger.warning(
                "could not write the fleet record to %s (%s: %s); training goes on",
                self._store.shown(self.path),
                type(e).__name__,
                e,
            )
        self._failed = True


# ------------------------------------------------------------------ reading
def fleet_fits(store: RecordStore) -> list[str]:
    """The fit ids that have a fleet record under this record root."""
    try:
        infos = store.filesystem.get_file_info(
            pafs.FileSelector(posixpath.join(store.root, FLEET_DIR), allow_not_found=True)
        )
    except FileNotFoundError:
        return []
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def read_fleet_meta(store: RecordStore, fit_id: str) -> dict[str, Any]:
    """One fit's `fleet.json` ({} when it cannot be read); raises `RecordStorageError` for a
    version this ray-ormas does not read."""
    folder = fleet_folder(store, fit_id)
    raw = store.read_bytes(posixpath.join(folder, FLEET_META))
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    version = meta.get("version", 1)  # written without one: version 1
    if version not in READABLE_FLEET_VERSIONS:
        raise RecordStorageError(
            f"the fleet record {store.shown(folder)} has version {version!r}, which this ray-ormas does not read "
            f"(it reads version {', '.join(map(str, READABLE_FLEET_VERSIONS))}): a newer ray-ormas wrote it. "
            "Install that ray-ormas (or a newer one) where you read it, then read it again"
        )
    return meta


def read_fleet_table(store: RecordStore, fit_id: str, table: str, meta: dict[str, Any] | None = None) -> pa.Table:
    """One fit's `checks` (rank rows) or `summaries` (one row per check) as an Arrow table, from
    the Parquet parts (version 2) or from `checks.jsonl` (version 1, its summaries computed)."""
    meta = read_fleet_meta(store, fit_id) if meta is None else meta
    folder = fleet_folder(store, fit_id)
    if meta.get("version", 1) >= 2:
        return read_table(store, folder, table)
    lines = store.read_lines(posixpath.join(folder, FLEET_CHECKS))
    plain = plain_schema(table)
    if table == CHECKS_TABLE:
        return pa.Table.from_pylist([{k: line.get(k) for k in plain.names} for line in lines], plain)
    by_check: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for line in lines:
        by_check.setdefault((line.get("attempt"), line.get("check")), []).append(line)
    rows = [{**check_summary(group), "full_rows": True} for group in by_check.values()]
    return pa.Table.from_pylist([{k: row.get(k) for k in plain.names} for row in rows], plain)


def read_fleet(store: RecordStore, fit_id: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(fleet.json, check lines, alarm lines) of one fit; a line cut short by a crash is skipped.
    The check lines are the rank rows the record kept (every check up to `record_ranks` ranks)."""
    meta = read_fleet_meta(store, fit_id)
    checks = read_fleet_table(store, fit_id, CHECKS_TABLE, meta).to_pylist()
    return meta, checks, read_fleet_alarms(store, fit_id)


def read_fleet_alarms(store: RecordStore, fit_id: str) -> list[dict[str, Any]]:
    """One fit's alarm lines, oldest first."""
    return store.read_lines(posixpath.join(fleet_folder(store, fit_id), FLEET_ALARMS))


def read_fleet_summaries(store: RecordStore, fit_id: str) -> list[dict[str, Any]]:
    """One fit's check summaries (record/check_summaries.py), oldest first."""
    return read_fleet_table(store, fit_id, SUMMARIES_TABLE).to_pylist()


def read_fleet_attempts(store: RecordStore, fit_id: str) -> list[dict[str, Any]]:
    """One fit's attempt lines (world size, first run step, resize or not); empty for a fleet
    record written before they existed."""
    return store.read_lines(posixpath.join(fleet_folder(store, fit_id), FLEET_ATTEMPTS))


def read_fleet_actions(store: RecordStore, fit_id: str) -> list[dict[str, Any]]:
    """One fit's actions (fleet/actions.py), each line merged with its outcome's, oldest first,
    with the stacks a `diagnose` captured (rank -> text) under `stacks`."""
    folder = fleet_folder(store, fit_id)
    actions: dict[Any, dict[str, Any]] = {}
    for line in store.read_lines(posixpath.join(folder, FLEET_ACTIONS)):
        if line.get("event") == "outcome" and line.get("id") in actions:
            actions[line["id"]].update({k: v for k, v in line.items() if k not in ("event", "id")})
        else:
            actions[line.get("id")] = dict(line)
    for line in store.read_lines(posixpath.join(folder, FLEET_STACKS)):
        if line.get("id") in actions:
            actions[line["id"]].setdefault("stacks", {})[str(line.get("rank"))] = line.get("stack")
    return list(actions.values())


def read_fleet_preflight(store: RecordStore, fit_id: str) -> list[dict[str, Any]]:
    """One fit's pre-flight screens, one dict per attempt screened (its verdict line: `attempt`,
    `ranks`, `seconds`, `clean`, `named`, `note`, `message`) with its ranks' lines under `rows`,
    oldest first; empty for a fleet record written before the screen existed."""
    screens: dict[Any, dict[str, Any]] = {}
    rows: dict[Any, list[dict[str, Any]]] = {}
    for line in store.read_lines(posixpath.join(fleet_folder(store, fit_id), FLEET_PREFLIGHT)):
        if line.get("event") == "verdict":
            screens[line.get("attempt")] = {k: v for k, v in line.items() if k != "event"}
        else:
            rows.setdefault(line.get("attempt"), []).append(line)
    return [{**screen, "rows": rows.get(attempt, [])} for attempt, screen in screens.items()]


def alarm_when(alarm: dict[str, Any]) -> str:
    """Where an alarm line was raised, in words: "at step N", or "before the first step" (the
    pre-flight screen's)."""
    if alarm.get("kind") == "preflight" and alarm.get("run_step") is None:
        return "before the first step"
    return f"at step {alarm.get('run_step')}"


def preflight_text(screen: dict[str, Any]) -> str:
    """One attempt's screen in words, as the report, the end-of-run summary and run.html say it."""
    seconds = f" in {screen['seconds']:.2f} s" if isinstance(screen.get("seconds"), (int, float)) else ""
    head = f"attempt {screen.get('attempt')}: {screen.get('ranks')} ranks screened{seconds}"
    if screen.get("clean"):
        text = f"{head}, clean"
    else:
        text = f"{head}: {screen.get('message')}"
    return f"{text} ({screen['note']})" if screen.get("note") else text


def action_text(line: dict[str, Any]) -> str:
    """One action (a line of `read_fleet_actions`) in words, as the report, the end-of-run
    summary and run.html say it."""
    what = ("diagnose, then " if line.get("diagnose") else "") + str(line.get("action"))
    ranks = ", ".join(str(r) for r in line.get("ranks") or []) or "-"
    where = f" at run step {line.get('run_step')}" if line.get("run_step") is not None else " before the first step"
    text = f"{what} after the {line.get('alarm')} alarm on ranks {ranks}{where}"
    text += f": {line.get('outcome')}"
    if line.get("seconds") is not None:
        text += f", training again {line['seconds']} s after the alarm"
    if line.get("evicted"):
        how = "drained for the whole cluster" if line.get("scope") == "cluster" else "kept out of this run"
        text += f", node{'s' if len(line['evicted']) > 1 else ''} {', '.join(line['evicted'])} {how}"
    if line.get("resumed_run_step") is not None:
        text += f", resumed at run step {line['resumed_run_step']}"
        if line.get("resumed_from"):
            text += f" from {line['resumed_from']}"
    elif line.get("checkpoint_run_step") is not None:
        text += f", from the checkpoint at run step {line['checkpoint_run_step']}"
    if line.get("reason"):
        text += f" ({line['reason']})"
    if line.get("stacks"):
        text += f"; stacks of ranks {', '.join(sorted(line['stacks']))} in stacks.jsonl"
    return text


def ranks_label(meta: dict[str, Any]) -> str:
    """'2 ranks', or '1 to 2 ranks (elastic)' for an elastic fit's fleet record."""
    elastic = meta.get("elastic")
    if isinstance(elastic, list) and len(elastic) == 2:
        return f"{elastic[0]} to {elastic[1]} ranks (elastic)"
    return f"{meta.get('world_size', '?')} ranks"


# ------------------------------------------------------------------ the summary
@dataclass(frozen=True)
class FleetSummary:
    """One fit's fleet health: per-rank table, alarms, and where the record is.

    Attributes:
        record: the fit's fleet folder, as a user would type it.
        ranks: per rank: node, checks, median data and forward time (ms), last and lowest
            straggler score, slow checks, checks with non-finite values.
        alarms: every alarm line (kind, ranks, node, step, message, ...), oldest first.
        checks: complete checks seen (every rank's facts in).
        loss_mean / loss_rank0: the fleet's mean loss and rank 0's at the last check.
        head_ms_per_check: the head node's CPU time per check (analysis, record, metrics, MLflow
            entries), when measured.
        attempts: one dict per worker-group attempt (`attempt`, `world_size`, `run_step`, `event`:
            "start", "restart" at the same size, or "resize" with `resized_from`), oldest first.
            An elastic fit's resizes are here, never among the alarms. An attempt that ended
            before its first step (its pre-flight screen's evict or stop) has no line here: its
            screen is in `preflight`.
        actions: one dict per action an alarm asked for (`FleetSettings.actions`): the alarm,
            the actions `requested`, the `action` carried out (after the stacks when `diagnose`
            is true), the ranks and node, the checkpoint chosen, the outcome and its reason,
            `seconds` from the alarm to the group training again, the run step and checkpoint it
            resumed from (`resumed_run_step`, `resumed_from`), the nodes an evict took out
            (`evicted`, `evicted_ids`, `scope`), and the `stacks` a `diagnose` captured
            (rank -> text), oldest first.
        messages: what reached the head, counted while the fit ran (empty when read back from
            storage): `relay_rows` (ranks' facts that came through their node's relay),
            `relay_messages` (the relays' calls: one per group of 32 nodes per check, and at a
            divergence one more from each node asked for group digests and one for the rest of
            its group), `rank_calls` (facts a rank sent the head itself: before its
            node's relay had started).
        preflight: one dict per attempt screened before its first step (`attempt`, `ranks`,
            `seconds`: the slowest rank's screen, `clean`, `named`: the ranks its alarm named,
            `note`: why nothing was compared, `message`: the alarm's, and `rows`: every rank's
            numbers: `compute_s`, `flops`, `link_s`, `allreduce_s`, `bytes_per_s`, the peers'
            medians, `facts` your probes returned, `broken`, `slow`, `why`), oldest first.
    """

    record: str
    ranks: list[dict[str, Any]]
    alarms: list[dict[str, Any]] = field(default_factory=list)
    checks: int = 0
    loss_mean: float | None = None
    loss_rank0: float | None = None
    head_ms_per_check: float | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    messages: dict[str, int] = field(default_factory=dict)
    preflight: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resizes(self) -> list[dict[str, Any]]:
        """The attempts that started at another world size than the one before."""
        return [a for a in self.attempts if a.get("event") == "resize"]

    def table(self) -> str:
        """The per-rank table, as the end-of-run summary prints it."""
        head = "  rank  node             checks  data ms  fwd ms  score  lowest  slow  non-finite"
        out = [head]
        for r in self.ranks:
            out.append(
                f"  {r['rank']:>4}  {str(r['node'])[:15]:<15}  {r['checks']:>6}  {_fmt(r['data_ms']):>7}  "
                f"{_fmt(r['forward_ms']):>6}  {_fmt(r['score'], 2):>5}  {_fmt(r['lowest_score'], 2):>6}  "
                f"{r['slow_checks']:>4}  {r['nonfinite_checks']:>10}"
            )
        return "\n".join(out)


def fleet_summary(
    record: str,
    checks: pa.Table | list[dict[str, Any]],
    alarms: list[dict[str, Any]],
    head_ms_per_check: float | None = None,
    attempts: list[dict[str, Any]] | None = None,
    actions: list[dict[str, Any]] | None = None,
    summaries: list[dict[str, Any]] | None = None,
    messages: dict[str, int] | None = None,
    preflight: list[dict[str, Any]] | None = None,
) -> FleetSummary:
    """The summary of one fit's check rows (the `checks` table, or its rows as dicts), alarm and
    attempt lines; the number of checks and the last losses from its check `summaries` when
    given (above `record_ranks` ranks the rows are kept at some checks only). Column arithmetic
    (numpy): a week of rows at 64 ranks is millions of them."""
    table = checks if isinstance(checks, pa.Table) else _rows_table(checks)
    ranks = per_rank_table(table)
    if summaries:
        n_checks = len(summaries)
        loss_mean, rank0 = summaries[-1].get("loss_mean"), summaries[-1].get("loss_rank0")
    else:
        rows = table.to_pylist()
        last_key = (rows[-1].get("attempt"), rows[-1].get("check")) if rows else None
        last = [x for x in rows if (x.get("attempt"), x.get("check")) == last_key]
        losses = [x["loss"] for x in last if isinstance(x.get("loss"), float) and math.isfinite(x["loss"])]
        loss_mean = statistics.fmean(losses) if losses else None
        rank0 = next((x.get("loss") for x in last if x.get("rank") == 0), None)
        n_checks = len({(x.get("attempt"), x.get("check")) for x in rows})
    return FleetSummary(
        record=record,
        ranks=ranks,
        alarms=list(alarms),
        checks=n_checks,
        loss_mean=loss_mean,
        loss_rank0=rank0,
        head_ms_per_check=head_ms_per_check,
        attempts=list(attempts or []),
        actions=list(actions or []),
        messages=dict(messages or {}),
        preflight=list(preflight or []),
    )


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = plain_schema(CHECKS_TABLE)
    return pa.Table.from_pylist([{k: row.get(k) for k in schema.names} for row in rows], schema)


def column(table: pa.Table, name: str, fill: float = math.nan) -> np.ndarray:
    """A numeric column as a float64 numpy array, nulls as `fill`."""
    return table.column(name).fill_null(fill).to_numpy().astype(np.float64)


def per_rank_table(table: pa.Table) -> list[dict[str, Any]]:
    """Per rank, in rank order: its node (at its last row), rows, median data and forward ms,
    last and lowest straggler score, slow rows and rows with non-finite values."""
    if table.num_rows == 0:
        return []
    ranks = table.column("rank").to_numpy()
    order = np.argsort(ranks, kind="stable")  # rank order, each rank's rows in record order
    starts = np.flatnonzero(np.r_[True, np.diff(ranks[order]) != 0])
    ends = np.r_[starts[1:], len(order)]
    data, forward, score = (column(table, n)[order] for n in ("data_s", "forward_s", "relative_score"))
    slow, nonfinite = (_flags(table, n)[order] for n in ("slow", "nonfinite"))
    nodes = table.column("node").take(pa.array(order[ends - 1])).to_pylist()  # each rank's last row's
    out = []
    for i, (a, b) in enumerate(zip(starts, ends)):
        scored = score[a:b][~np.isnan(score[a:b])]
        out.append(
            {
                "rank": int(ranks[order[a]]),
                "node": nodes[i],
                "checks": int(b - a),
                "data_ms": _median_ms(data[a:b]),
                "forward_ms": _median_ms(forward[a:b]),
                "score": float(scored[-1]) if scored.size else None,
                "lowest_score": float(scored.min()) if scored.size else None,
                "slow_checks": int(slow[a:b].sum()),
                "nonfinite_checks": int(nonfinite[a:b].sum()),
            }
        )
    return out


def _flags(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def _median_ms(values: np.ndarray) -> float | None:
    got = values[~np.isnan(values)]
    return float(np.median(got)) * 1000 if got.size else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ------------------------------------------------------------------ MLflow
def mlflow_entries(
    checks: list[dict[str, Any]],
    alarms: list[dict[str, Any]],
    mlflow_ranks: int,
    actions: list[dict[str, Any]] | None = None,
    summaries: list[dict[str, Any]] | None = None,
    preflight: list[dict[str, Any]] | None = None,
) -> list[tuple[str, float, int]]:
    """The MLflow metrics (name, value, run step) of fleet lines: the fleet's loss, rank 0's and
    the lowest score of each check (from its `summaries`, else from the rows), each rank's
    scores below `mlflow_ranks` where the record kept its row; the live writer and
    `ray-ormas mlflow-sync` both use this, so they agree on what the run should hold."""
    out: list[tuple[str, float, int]] = []
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for line in checks:
        groups.setdefault((line.get("attempt"), line.get("check")), []).append(line)
    if summaries is None:
        summaries = [{**check_summary(lines), "full_rows": True} for lines in groups.values()]
    for s in summaries:
        step = s.get("run_step")
        if not isinstance(step, int):
            continue
        if s.get("loss_mean") is not None:
            out.append(("fleet/loss_mean", s["loss_mean"], step))
        if s.get("relative_score_min") is not None:
            out.append(("fleet/min_score", float(s["relative_score_min"]), step))
        if isinstance(s.get("loss_rank0"), float):
            out.append(("fleet/loss_rank0", s["loss_rank0"], step))
    for lines in groups.values():
        step = lines[0].get("run_step")
        if not isinstance(step, int):
            continue
        for x in lines:
            if int(x.get("rank", 0)) < mlflow_ranks:
                for key, name in (("relative_score", "score"), ("individual_score", "individual_score")):
                    if isinstance(x.get(key), (int, float)):
                        out.append((f"fleet/rank_{x['rank']}/{name}", float(x[key]), step))
    for a in alarms:
        step = a.get("run_step") if isinstance(a.get("run_step"), int) else a.get("last_run_step", 0)
        out.append((f"fleet/alarms/{a['kind']}", float(len(a.get("ranks") or []) or 1), int(step or 0)))
    for screen in preflight or []:  # each attempt's screen, at the attempt's number as the step
        attempt = int(screen.get("attempt") or 0)
        out.append(("fleet/preflight/named", float(len(screen.get("named") or [])), attempt))
        if isinstance(screen.get("seconds"), (int, float)):
            out.append(("fleet/preflight/seconds", float(screen["seconds"]), attempt))
    for line in actions or []:  # 1 for an action carried out, 0 for one that only logged
        if line.get("event") != "outcome" and line.get("alarm"):
            done = 0.0 if line.get("action") == "log" else 1.0
            out.append((f"fleet/actions/{line['alarm']}", done, int(line.get("run_step") or 0)))
    return out


def _warm_arrow() -> None:
    """Arrow's first conversion from Python imports its pandas shim (about a second of CPU, the
    GIL held): done as the writer starts, so the first part, written while checks come, does not
    starve the ledger's event loop."""
    with contextlib.suppress(Exception):  # only a warm-up
        pa.Table.from_pylist([{"warm": 0}])
