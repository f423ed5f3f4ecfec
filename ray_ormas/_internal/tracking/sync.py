"""What a fit's MLflow run should hold, computed from the record, and bringing the run up to it.

The head-node writer (head/mlflow_writer.py) sends rows as they come; this module is the ground
truth behind it, used at the end of every attempt and of the fit, and by `ray-ormas mlflow-sync
RUN` after an outage that outlasted the fit:

* **The tracking journal** (`<record root>/.mlflow/<fit_id>.json`, one per fit, written by the
  writer to the run's storage, which the head node reaches even while MLflow does not): the
  tracking URI, experiment, run name, tags and params, the run id once the run exists, every
  report's loop metrics at their step, every reported checkpoint (step, path, record pointer,
  metrics), and the fit's final status. The record has the monitor's rows; the journal has the
  rest, so nothing the run should show lives only in memory.
* **Expected entries**: (name, value, step) triples. Monitor rows and events of every segment of
  the fit, named by ormas-monitor's own MLflowSink (compat.MetricNaming) at the run's step
  (segment step + `step_offset`); `ormas/attempt` = the attempt index at the step each attempt
  starts from; the loop's metrics at their report's step; `ormas/checkpoint` = 1 at each
  checkpoint's step; at the fit's end, the whole run's counts (record/run_facts.py: `ormas/alarms`,
  `ormas/repairs`, `ormas/channels_repaired`, ..., `ormas/segments`) once, at the run step where
  the run's last segment ended: the values the run ends with.
* **Sync**: what MLflow lacks (a multiset difference per metric and step, NaN equal to NaN, Inf
  as MLflow stores it) is sent; record segments, the run's page (`run.html`) and chosen
  checkpoints are uploaded as artifacts where missing; the final status is set. Running it twice adds nothing.

Hooks relied on: `MlflowClient` (`get_metric_history`, `log_batch`, `list_artifacts`,
`log_artifact(s)`, `log_dict`, `set_terminated`), the record layout (record/store.py, record/segments.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow.fs as pafs

from ray_ormas._internal.common import keys
from ray_ormas._internal.record.fit_timeline import last_run_step, read_timeline
from ray_ormas._internal.record.goodput import GoodputAccount, account_of, goodput_entries, goodput_params
from ray_ormas._internal.record.layout import DIARY, JOURNAL_DIR, METRICS, RUN_PAGE, join_parts, whole_name
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.run_facts import run_facts
from ray_ormas._internal.record.segments import event_step
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.journal import JournalCheckpoint, TrackingJournal, parse_journal
from ray_ormas._internal.tracking.values import PARAM_VALUE_LIMIT, TAG_VALUE_LIMIT, fit_params, flatten_params, shown
from ray_ormas.errors import JournalError

METRICS_PER_BATCH = 1000  # MLflow's limits per log_batch request
PARAMS_PER_BATCH = 100
MAX_DOUBLE = 1.7976931348623157e308
TERMINAL = ("FINISHED", "FAILED", "KILLED")
FIT_ID_TAG = "ray_ormas.fit_id"  # the fit a run belongs to: a run is never created twice for one fit

Entry = tuple[str, float, int]  # (metric name, value, step)


def journal_path(store: RecordStore, fit_id: str) -> str:
    return posixpath.join(store.root, JOURNAL_DIR, f"{fit_id}.json")


def new_journal(
    *,
    fit_id: str,
    run_name: str,
    tracking_uri: str,
    experiment: str,
    mlflow_run_name: str,
    tags: dict[str, str],
    params: dict[str, Any],
    run_id: str | None,
    log_checkpoints: str,
    checkpoint_metric: str | None,
    checkpoint_mode: str,
) -> TrackingJournal:
    values, cut = fit_params(flatten_params(params))
    return TrackingJournal.model_validate(
        {
            "fit_id": fit_id,
            "run_name": run_name,
            "tracking_uri": tracking_uri,
            "experiment": experiment,
            "mlflow_run_name": mlflow_run_name,
            "tags": {"ray_ormas.ray_run_name": run_name, **tags},
            "params": values,
            "truncated_params": cut,
            "run_id": run_id,
            "continued": run_id is not None,
            "log_checkpoints": log_checkpoints,
            "checkpoint_metric": checkpoint_metric,
            "checkpoint_mode": checkpoint_mode,
        }
    )


def write_journal(store: RecordStore, journal: TrackingJournal) -> None:
    """Write the journal whole (atomically: a temporary file renamed locally, one object elsewhere)."""
    path = journal_path(store, journal.fit_id)
    data = (json.dumps(journal.to_json_dict(), indent=1, sort_keys=True) + "\n").encode()
    store.filesystem.create_dir(posixpath.dirname(path), recursive=True)
    if store.is_local:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        Path(tmp).write_bytes(data)
        os.replace(tmp, path)
    else:
        store.write_bytes(path, data)


def read_journals(store: RecordStore) -> list[TrackingJournal]:
    """Every fit's journal under a record root, oldest first. JournalError for one this ray-ormas
    cannot read (tracking/journal.py): a newer version, or damaged."""
    folder = posixpath.join(store.root, JOURNAL_DIR)
    try:
        infos = store.filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    out = []
    for info in infos:
        if info.type == pafs.FileType.File and info.base_name.endswith(".json"):
            where = store.shown(info.path)
            try:
                data = json.loads(store.read_bytes(info.path) or b"")
            except ValueError as e:
                raise JournalError(
                    f"the MLflow journal {where} is not JSON ({e}). The record itself is not affected; "
                    "move the file aside to sync the run's other fits, or restore it from a backup"
                ) from None
            journal = parse_journal(data, where)
            if journal is not None:
                out.append((info.mtime_ns or 0, journal))
    return [j for _, j in sorted(out, key=lambda t: t[0])]


# ------------------------------------------------------------------ expected entries
def loop_entries(journal: TrackingJournal) -> list[Entry]:
    out = [(k, float(v), r.step) for r in journal.reports for k, v in r.metrics.items()]
    out += [(keys.CHECKPOINT, 1.0, c.step) for c in journal.checkpoints]
    return out


def record_entries(records: RunRecords, fit_id: str, up_to_attempt: int | None = None) -> list[Entry]:
    """The monitor's rows, events and attempt starts of one fit, from its record, at run steps."""
    from ray_ormas._internal.seams.ormas import MetricNaming

    namings: dict[str, MetricNaming] = {}
    out: list[Entry] = []
    for seg in records.segments():
        attempt = seg.attempt if seg.attempt is not None else 0
        if seg.link.get("fit_id") != fit_id or (up_to_attempt is not None and attempt > up_to_attempt):
            continue
        prefix = seg.link.get("metric_prefix") or "ormas"
        naming = namings.get(prefix) or namings.setdefault(prefix, MetricNaming(prefix))
        offset = seg.step_offset
        if prefix == "ormas":
            out.append((keys.ATTEMPT, float(attempt), offset))
            if isinstance(seg.link.get("world_size"), int):
                out.append((keys.WORLD_SIZE, float(seg.link["world_size"]), offset))
        for row in records.store.read_lines(posixpath.join(seg.path, METRICS)):
            if isinstance(row.get("step"), int):
                out += naming.entries("metrics", {**row, "step": row["step"] + offset})
        last = 0
        for line in records.store.read_lines(posixpath.join(seg.path, DIARY)):
            last = event_step(line, last)
            out += naming.entries("event", {"event": line.get("event"), "step": last + offset})
    return out


def run_count_entries(store: RecordStore) -> list[Entry]:
    """The whole run's counts (record/run_facts.py), each once, at the run step where the run's
    last segment ended: the values the MLflow run ends with (`ormas/alarms`, `ormas/repairs`,
    `ormas/channels_repaired`, ..., `ormas/segments`), over every attempt whichever checkpoint
    Ray resumed from."""
    out: list[Entry] = []
    for monitor in store.monitors():
        facts = run_facts(store, monitor)
        if not facts.segments:
            continue
        prefix = facts.segments[-1].metric_prefix
        totals = {**{k: v for k, v in facts.totals.items() if k != "steps"}, keys.SEGMENTS: facts.attempts}
        out += [(f"{prefix}/{name}", float(value), facts.run_step) for name, value in totals.items()]
    return out


def goodput_entries_of(store: RecordStore, fit_id: str) -> list[Entry]:
    """The fit's closed goodput account (record/goodput.py) as `goodput/*` metrics, at its last
    run step; [] while it is open or when the fit kept no timeline."""
    account, step = _closed_goodput(store, fit_id)
    return goodput_entries(account, step) if account is not None else []


def log_goodput_params(client: Any, run_id: str, store: RecordStore, fit_id: str) -> None:
    """The closed account as `goodput.*` params; those already logged keep their value (MLflow
    params are immutable: the first close's, at the fit's wind-down, stand)."""
    from mlflow.entities import Param

    account, _ = _closed_goodput(store, fit_id)
    if account is None:
        return
    existing = client.get_run(run_id).data.params
    items = [Param(k, v) for k, v in goodput_params(account).items() if k not in existing]
    if items:
        client.log_batch(run_id, params=items)


def _closed_goodput(store: RecordStore, fit_id: str) -> tuple[GoodputAccount | None, int]:
    timeline = read_timeline(store, fit_id)
    if timeline is None or timeline.closed is None:
        return None, 0
    # As of the wind-down, when the fit's own sync sent it: the same values at every later sync.
    return account_of(dataclasses.replace(timeline, returned=None)), last_run_step(timeline)


def fleet_entries(store: RecordStore, fit_id: str, up_to_attempt: int | None = None) -> list[Entry]:
    """Fleet health's scores, alarms and actions of one fit, from its fleet record (record/fleet_record.py)."""
    from ray_ormas._internal.record.fleet_record import (
        mlflow_entries,
        read_fleet,
        read_fleet_actions,
        read_fleet_preflight,
        read_fleet_summaries,
    )

    meta, checks, alarms = read_fleet(store, fit_id)
    if not meta:
        return []
    summaries = read_fleet_summaries(store, fit_id)
    actions = read_fleet_actions(store, fit_id)
    preflight = read_fleet_preflight(store, fit_id)
    if up_to_attempt is not None:
        checks, alarms, summaries, actions, preflight = (
            [x for x in lines if (x.get("attempt") or 0) <= up_to_attempt]
            for lines in (checks, alarms, summaries, actions, preflight)
        )
    mlflow_ranks = int((meta.get("settings") or {}).get("mlflow_ranks", 64))
    return mlflow_entries(checks, alarms, mlflow_ranks, actions, summaries=summaries, preflight=preflight)


# ------------------------------------------------------------------ comparing and sending
def canonical(value: float) -> str:
    """A value as MLflow stores it, for comparing: NaN is NaN, Inf is the largest double."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        value = math.copysign(MAX_DOUBLE, value)
    return repr(float(value))


def missing_entries(client: Any, run_id: str, expected: Iterable[Entry]) -> list[Entry]:
    """The expected entries MLflow does not have (as many times as they are missing)."""
    by_key: dict[str, list[Entry]] = {}
    for e in expected:
        by_key.setdefault(e[0], []).append(e)
    out: list[Entry] = []
    for key, entries in by_key.items():
        have = Counter((m.step, canonical(m.value)) for m in client.get_metric_history(run_id, key))
        for e in entries:
            k = (e[2], canonical(e[1]))
            if have[k] > 0:
                have[k] -= 1
            else:
                out.append(e)
    return out


def send_entries(client: Any, run_id: str, entries: list[Entry], timestamps: list[int] | None = None) -> None:
    """log_batch in MLflow's batch size. Each entry gets its own timestamp (given, else now + i ms)
    so that two equal values at one step stay two (MLflow drops exact duplicates)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    stamps = timestamps or [now + i for i in range(len(entries))]
    for i in range(0, len(entries), METRICS_PER_BATCH):
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, v, t, s)
                for (k, v, s), t in zip(entries[i : i + METRICS_PER_BATCH], stamps[i : i + METRICS_PER_BATCH])
            ],
        )


# ------------------------------------------------------------------ the run itself
def open_run(client: Any, journal: TrackingJournal) -> str:
    """Create the journal's run (or take the existing one) and log its params and tags; return its
    id. Params already there keep their value (MLflow params are immutable); changes go in a tag."""
    from mlflow.entities import Param, RunTag

    existing: dict[str, str] = {}
    run_id = journal.run_id
    if run_id:
        run = client.get_run(run_id)
        existing = dict(run.data.params)
        if journal.continued and journal.status is None:
            client.update_run(run_id, status="RUNNING")
    else:
        exp = client.get_experiment_by_name(journal.experiment)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            uri = journal.tracking_uri
            location = (
                None
                if not uri.startswith("sqlite:")
                else Path(uri.removeprefix("sqlite:///")).resolve().parent.joinpath("artifacts").as_uri()
            )
            exp_id = client.create_experiment(journal.experiment, artifact_location=location)
        # A run an earlier try created (its answer lost, or the tracker gone before its params):
        # taken, never created twice.
        earlier = client.search_runs([exp_id], filter_string=f"tags.`{FIT_ID_TAG}` = '{journal.fit_id}'", max_results=1)
        if earlier:
            run_id = earlier[0].info.run_id
            existing = dict(earlier[0].data.params)
        else:
            first_tags = {**journal.tags, FIT_ID_TAG: journal.fit_id}
            run_id = client.create_run(exp_id, run_name=journal.mlflow_run_name, tags=first_tags).info.run_id
    params = journal.params
    changed = [k for k, v in params.items() if k in existing and existing[k] != v]
    items = [Param(k, v[:PARAM_VALUE_LIMIT]) for k, v in params.items() if k not in existing]
    for i in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH])
    tags = [
        RunTag(t, ",".join(keys)[:TAG_VALUE_LIMIT])
        for t, keys in (
            ("ray_ormas.truncated_params", journal.truncated_params),
            ("ray_ormas.changed_params", changed),
        )
        if keys
    ]
    if journal.continued:
        tags += [RunTag(k, v) for k, v in journal.tags.items()]
    if tags:
        client.log_batch(run_id, tags=tags)
    return run_id


def loop_ended(records: RunRecords, fit_id: str) -> bool:
    """The fit's loop ended on rank 0 in its last attempt: each of that attempt's segments ends
    with a run_end that carries no error (record/reader.py `Segment.loop_ended`)."""
    segments = [s for s in records.segments() if s.link.get("fit_id") == fit_id]
    if not segments:
        return False
    last = max(s.attempt or 0 for s in segments)
    return all(s.loop_ended for s in segments if (s.attempt or 0) == last)


def close_unended(journal: TrackingJournal, close_as: str | None, *, loop_ended: bool) -> None:
    """Close, in the journal, a fit that never reached its end (`ray-ormas mlflow-sync`). A fit
    whose loop ended (its record says so) is FINISHED: only the driver's end was cut off (a Ray
    Tune trial stopped at its last report). Else `close_as` (`--close-as`), with an error that
    says so."""
    if loop_ended:
        journal.status = "FINISHED"
        journal.closed_by = (
            "ray-ormas mlflow-sync: the loop ended (the record's run_end says so), but the fit's own end "
            "did not run (a Ray Tune trial stopped at its last report, or a driver that was killed)"
        )
        return
    status = close_as or "KILLED"
    journal.status = status
    journal.closed_by = f"ray-ormas mlflow-sync --close-as {status}"
    journal.error = (
        f"closed as {status} by ray-ormas mlflow-sync: the fit never reached its end "
        "(a Ray Tune trial that a scheduler stopped, or a driver that was killed)"
    )


def close_run(client: Any, journal: TrackingJournal) -> None:
    """Closing tags and the final status, as the journal has them."""
    from mlflow.entities import RunTag

    status = journal.status or "FINISHED"
    tags = [RunTag("ray_ormas.status", status)]
    if journal.error:
        tags.append(RunTag("ray_ormas.error", journal.error[:TAG_VALUE_LIMIT]))
    if journal.closed_by:
        tags.append(RunTag("ray_ormas.closed_by", journal.closed_by[:TAG_VALUE_LIMIT]))
    if journal.final_checkpoint:
        tags.append(RunTag("ray_ormas.final_checkpoint", journal.final_checkpoint[:TAG_VALUE_LIMIT]))
    if journal.skipped_metrics:
        tags.append(RunTag("ray_ormas.skipped_metrics", ",".join(journal.skipped_metrics)[:TAG_VALUE_LIMIT]))
    client.log_batch(journal.run_id, tags=tags)
    client.set_terminated(journal.run_id, status=status)


# ------------------------------------------------------------------ artifacts
def _artifact_files(client: Any, run_id: str, path: str) -> dict[str, int | None]:
    """The run's files under `path`, at any depth, by their path relative to `path`."""
    files: dict[str, int | None] = {}
    for f in client.list_artifacts(run_id, path):
        if f.is_dir:
            files.update(
                {
                    posixpath.join(posixpath.basename(f.path), k): v
                    for k, v in _artifact_files(client, run_id, f.path).items()
                }
            )
        else:
            files[posixpath.basename(f.path)] = f.file_size
    return files


def _uploaded(have: dict[str, int | None], name: str, size: int | None) -> bool:
    """Whether the run holds `name` with `size` bytes. The tracking server lists an empty file's
    size as None."""
    if name not in have:
        return False
    return have[name] == size or (have[name] is None and size == 0)


def upload_folder(client: Any, run_id: str, fs: pafs.FileSystem, folder: str, artifact_path: str) -> int:
    """Upload the files of `folder` (on `fs`) that the run lacks under `artifact_path` (or has
    with another size); return how many. A file that a segment which never closed left only in
    parts on object storage (`X.parts/`, record/uploads.py) is put together and uploaded whole, as `X`.
    Files not on the local disk go through a temporary folder that is removed again."""
    have = _artifact_files(client, run_id, artifact_path)
    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    files = {
        posixpath.relpath(i.path, folder): i
        for i in infos
        if i.type == pafs.FileType.File and not i.base_name.endswith(".tmp")
    }
    in_parts: dict[str, list[pafs.FileInfo]] = {}
    for rel in list(files):
        whole = whole_name(posixpath.dirname(rel))
        if whole is None:
            continue
        info = files.pop(rel)
        in_parts.setdefault(whole, []).append(info)
    in_parts = {whole: parts for whole, parts in in_parts.items() if whole not in files}  # closed since
    todo = [rel for rel, info in files.items() if not _uploaded(have, rel, info.size)]
    local = isinstance(fs, pafs.LocalFileSystem)
    staged = in_parts or (todo and not local)
    staging = Path(tempfile.mkdtemp(prefix="ray-ormas-artifacts-")) if staged else Path()
    sources: dict[str, str] = {}
    try:
        for rel in todo:
            sources[rel] = files[rel].path if local else _copy_to(staging, rel, fs, files[rel].path)
        for whole, parts in in_parts.items():
            data = join_parts((p.base_name, _read(fs, p.path)) for p in parts)
            if not _uploaded(have, whole, len(data)):
                sources[whole] = str(staging / whole)
                Path(sources[whole]).parent.mkdir(parents=True, exist_ok=True)
                Path(sources[whole]).write_bytes(data)
        for rel, src in sources.items():
            sub = posixpath.dirname(rel)
            client.log_artifact(run_id, src, artifact_path=posixpath.join(artifact_path, sub) if sub else artifact_path)
    finally:
        if staged:
            shutil.rmtree(staging, ignore_errors=True)
    return len(sources)


def _copy_to(staging: Path, rel: str, fs: pafs.FileSystem, path: str) -> str:
    local = staging / rel
    local.parent.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(path, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return str(local)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def upload_segments(client: Any, run_id: str, records: RunRecords, fit_id: str) -> int:
    """Each segment of the fit under `ormas/<monitor>/segment-NNN/`; return the files uploaded."""
    n = 0
    for seg in records.segments():
        if seg.link.get("fit_id") == fit_id:
            n += upload_folder(
                client,
                run_id,
                records.store.filesystem,
                seg.path,
                f"ormas/{seg.monitor}/{posixpath.basename(seg.path)}",
            )
    return n


def upload_run_page(client: Any, run_id: str, store: RecordStore) -> int:
    """The run's page (`run.html` at the record's root, driver/run_page.py) as `ormas/run.html`,
    when the run lacks it or holds another version of it; return 1 if uploaded."""
    path = posixpath.join(store.root, RUN_PAGE)
    info = store.filesystem.get_file_info(path)
    if info.type != pafs.FileType.File or _uploaded(_artifact_files(client, run_id, "ormas"), RUN_PAGE, info.size):
        return 0
    staging = Path(tempfile.mkdtemp(prefix="ray-ormas-artifacts-"))
    try:
        local = staging / RUN_PAGE
        local.write_bytes(_read(store.filesystem, path))
        client.log_artifact(run_id, str(local), artifact_path="ormas")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 1


def chosen_checkpoints(journal: TrackingJournal) -> list[JournalCheckpoint]:
    """The reported checkpoints the policy uploads (see MLflowSettings.log_checkpoints)."""
    checkpoints = journal.checkpoints
    policy = journal.log_checkpoints
    if policy == "all":
        return list(checkpoints)
    if policy == "last":
        chosen = [c for c in checkpoints if c.path == journal.final_checkpoint] or checkpoints[-1:]
        return chosen[-1:]
    if policy == "best" and journal.checkpoint_metric is not None:
        metric, sign = journal.checkpoint_metric, (1 if journal.checkpoint_mode == "min" else -1)
        scored = [(value, c) for c in checkpoints if (value := c.metric(metric)) is not None]
        return [min(scored, key=lambda vc: sign * vc[0])[1]] if scored else []
    return []


def upload_checkpoints(
    client: Any, run_id: str, journal: TrackingJournal, fs: pafs.FileSystem
) -> tuple[int, list[str]]:
    """Upload the chosen checkpoints under `checkpoints/<folder name>/`; (files uploaded, the
    chosen checkpoints that no longer exist in storage, e.g. removed by `num_to_keep`)."""
    n, gone = 0, []
    for c in chosen_checkpoints(journal):
        path = c.path
        artifact_path = f"checkpoints/{posixpath.basename(path.rstrip('/'))}"
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            if not client.list_artifacts(run_id, artifact_path):  # not uploaded before it was deleted
                gone.append(path)
            continue
        n += upload_folder(client, run_id, fs, path, artifact_path)
    return n, gone


# ------------------------------------------------------------------ the whole sync
@dataclass
class SyncResult:
    run_id: str
    tracking_uri: str
    sent: int  # metric values sent
    artifacts: int  # files uploaded
    created: bool  # the run did not exist yet
    closed: str | None  # the final status set, if it was not set yet
    missing_checkpoints: list[str]


def sync_fit(
    client: Any,
    records: RunRecords,
    journal: TrackingJournal,
    *,
    up_to_attempt: int | None = None,
    finished: bool = True,
    checkpoint_fs: pafs.FileSystem | None = None,
) -> SyncResult:
    """Bring the fit's run up to its record and journal. `finished`: also artifacts and status."""
    store = records.store
    created = not journal.run_id
    run_id = open_run(client, journal)
    if created:
        journal.run_id = run_id
        write_journal(store, journal)
    expected = (
        record_entries(records, journal.fit_id, up_to_attempt)
        + loop_entries(journal)
        + fleet_entries(store, journal.fit_id, up_to_attempt)
        + (run_count_entries(store) + goodput_entries_of(store, journal.fit_id) if finished else [])
    )
    todo = missing_entries(client, run_id, expected)
    send_entries(client, run_id, todo)
    artifacts, closed = 0, None
    gone: list[str] = []
    if finished:
        log_goodput_params(client, run_id, store, journal.fit_id)
        artifacts = upload_segments(client, run_id, records, journal.fit_id)
        from ray_ormas._internal.record.fleet_record import fleet_folder

        artifacts += upload_folder(
            client, run_id, store.filesystem, fleet_folder(store, journal.fit_id), f"ormas/fleet/{journal.fit_id}"
        )
        artifacts += upload_run_page(client, run_id, store)
        if journal.checkpoints:
            client.log_dict(run_id, [c.model_dump() for c in journal.checkpoints], "ray_ormas/checkpoints.json")
        n, gone = upload_checkpoints(client, run_id, journal, checkpoint_fs or store.filesystem)
        artifacts += n
        if journal.status in TERMINAL and client.get_run(run_id).info.status != journal.status:
            close_run(client, journal)
            closed = journal.status
    return SyncResult(
        run_id=run_id,
        tracking_uri=shown(journal.tracking_uri),
        sent=len(todo),
        artifacts=artifacts,
        created=created,
        closed=closed,
        missing_checkpoints=gone,
    )
