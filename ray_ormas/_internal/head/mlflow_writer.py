"""The fit's MLflow writer: it lives in the job's MLflow host on the head node (head/mlflow_host.py),
or in the fit's run ledger (head/ledger.py) where there is no host; the only process that talks
to MLflow. The ledger reaches it through head/mlflow_link.py.

    driver      RunLedger(WriterSpec, FleetSpec) -> the ledger opens the TrackingWriter, returns at once
    rank 0      RowForwarder (an ormas-monitor sink): ledger.track_rows.remote(...) per check, never waits
    controller  LedgerCallback.after_report     -> ledger.track_report.remote(rank 0's metrics, checkpoint)
                LedgerCallback.after_exception  -> ledger.track_attempt_end.remote()   (sync that attempt)
    driver      ledger.finish_tracking(status)  -> drain, sync, artifacts, status; then the ledger goes

Calls only append to an in-memory outbox (bounded by `MLflowSettings.max_pending` metric values;
beyond it the oldest are dropped from memory and come back from the record at the end) and to
the tracking journal in the run's storage (tracking/journal.py). One sender thread names rank 0's rows
(ormas-monitor's MLflowSink, through seams/ormas.py), creates the run and sends the outbox in
batches, about once a second. While the fit starts, a thread of its own imports mlflow at
SCHED_IDLE, taking only the CPU the start-up leaves idle, and at nice 19 once training has
started (where the thread could not leave SCHED_IDLE again, at nice 19 throughout: `_Importer`);
it creates the store and the run only after rank 0's first check, off the path to the first
training step. On any failure it keeps
everything and tries again after 1, 2, 4, ... 30 s. A failed attempt's end and the fit's end
each bring the run up to the record and the journal (`mlflow_sync.sync_fit`).

Entries carry the timestamp they were received with, so a batch resent after a timeout that the
server did store is dropped by MLflow as an exact duplicate.

Hooks relied on: `MlflowClient`, two threads of its own in its process (Linux's
`sched_setscheduler` / `setpriority` per thread where available), and the driver's MLflow
environment variables handed to the ledger's constructor (so only the driver and the head node
hold them).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow.fs as pafs

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.mlflow_settings import MLflowSettings
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.segments import record_pointer
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.journal import JournalCheckpoint, JournalReport, TrackingJournal
from ray_ormas._internal.tracking.sqlite_seed import seed_new_store
from ray_ormas._internal.tracking.sync import (
    Entry,
    new_journal,
    open_run,
    send_entries,
    sync_fit,
    upload_folder,
    write_journal,
)
from ray_ormas._internal.tracking.values import embedded_uri, first_line, loop_metrics, quick_requests, shown

logger = get_logger("ray_ormas.mlflow")
BACKOFF_S = (1, 2, 4, 8, 16, 30)
STAGE_HERE: Any = object()  # loop_report: copy the checkpoint for upload in the call itself


@dataclass(frozen=True)
class WriterSpec:
    """What the driver gives the writer."""

    settings: MLflowSettings
    store: RecordStore
    fit_id: str
    run_name: str
    params: dict[str, Any]
    run_dir: str | None  # the run's folder when its storage is local (the embedded store's home)
    environment: dict[str, str]  # MLflow's variables from the driver's environment
    host_idle_s: float = 0.0  # > 0: the writer lives in the job's MLflow host (head/mlflow_link.py)


@dataclass(frozen=True)
class TrackingOutcome:
    """What the writer says when the fit ends."""

    run_id: str | None
    tracking_uri: str | None
    complete: bool  # MLflow holds everything the record and the journal hold
    error: str | None = None
    pending: int = 0  # metric values the run still lacks (then `ray-ormas mlflow-sync`)


class TrackingWriter:
    """The head node's MLflow writer of one fit (see the module docstring)."""

    def __init__(self, spec: WriterSpec) -> None:
        os.environ.update(spec.environment)
        s = spec.settings
        quick_requests(s.request_timeout_s)
        self._spec = spec
        self._uri = s.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or embedded_uri(spec.run_dir)
        self._journal = new_journal(
            fit_id=spec.fit_id,
            run_name=spec.run_name,
            tracking_uri=self._uri,
            experiment=s.experiment_name,
            mlflow_run_name=s.run_name or spec.run_name,
            tags=dict(s.tags),
            params=spec.params,
            run_id=s.run_id,
            log_checkpoints=s.log_checkpoints,
            checkpoint_metric=s.checkpoint_metric,
            checkpoint_mode=s.checkpoint_mode,
        )
        self._lock = threading.Lock()  # journal, outbox, tasks: held briefly, never during I/O
        self._io = threading.Lock()  # one sender at a time: the thread, or finish()
        self._journal_io = threading.Lock()  # one journal write at a time, each of the newest state
        self._outbox: deque[tuple[Entry, int]] = deque()
        self._tasks: deque[int] = deque()  # attempts whose end asks for a sync
        self._raw: deque[tuple[str, int, str, dict[str, Any], int]] = deque()  # rows not yet named
        self._uploads: deque[tuple[Path, str]] = deque()  # staged checkpoints (log_checkpoints="all")
        self._namings: dict[str, Any] = {}
        self._dropped = 0
        self._attempt = 0
        self._closed = False
        self._client: Any = None
        self._run_id: str | None = None  # the run, once open
        self._outage: str | None = None
        self._journal_failed = False
        self._wake = threading.Event()
        self._training = threading.Event()  # set by the first check, report, failed attempt or finish
        self._save_journal()
        threading.Thread(target=self._run, name="ray-ormas-mlflow", daemon=True).start()

    # ------------------------------------------------------------------ called by rank 0 and the controller
    def rows(self, prefix: str, offset: int, kind: str, payload: dict[str, Any]) -> None:
        """One monitor row or event from rank 0, its step the segment's; logged at offset + step.
        Named (ormas-monitor's MLflowSink, which imports mlflow) by the sender thread, later."""
        with self._lock:
            if self._closed:
                return  # the final sync takes it from the record
            self._raw.append((prefix, offset, kind, payload, int(time.time() * 1000)))
            self._trim(self._raw)
        if kind == "metrics":  # the first check: training has started
            self._training.set()

    def fleet(self, entries: list[Entry]) -> None:
        """Fleet health's scores and alarms of one check (fleet_record.mlflow_entries), at run steps."""
        with self._lock:
            if not self._closed:
                self._add(entries)

    def attempt_started(self, attempt: int, offset: int, world_size: int | None = None) -> None:
        """Rank 0's main monitor of a new attempt starts at run step `offset`, with `world_size`
        ranks (`ormas/world_size` there: an elastic fit's sizes, attempt by attempt)."""
        with self._lock:
            self._attempt = attempt
            if not self._closed:
                entries = [(keys.ATTEMPT, float(attempt), int(offset))]
                if world_size is not None:
                    entries.append((keys.WORLD_SIZE, float(world_size), int(offset)))
                self._add(entries)

    def loop_report(
        self, metrics: dict[str, Any], step: int | None, checkpoint: Any = None, staged: Any = STAGE_HERE
    ) -> None:
        """Rank 0's metrics of one `ray_ormas.report` (what Ray's Result.metrics holds) and its
        checkpoint; `staged`: the checkpoint's copy for `log_checkpoints="all"`, made by the
        caller (`stage_for_upload`: a writer in the MLflow host gets the call later than Ray may
        delete the checkpoint), or STAGE_HERE to make it now."""
        kept, skipped = loop_metrics(metrics)
        pointer = None
        if staged is STAGE_HERE:
            staged = stage_for_upload(self._spec.settings, checkpoint)
        if checkpoint is not None:
            pointer = record_pointer(checkpoint)
        with self._lock:
            j = self._journal
            if step is None:
                step = len(j.reports)
            j.reports.append(JournalReport(step=int(step), attempt=self._attempt, metrics=kept))
            j.skipped_metrics = sorted(set(j.skipped_metrics) | set(skipped))
            entries = [(k, v, int(step)) for k, v in kept.items()]
            if checkpoint is not None:
                j.checkpoints.append(
                    JournalCheckpoint(step=int(step), path=checkpoint.path, record=pointer, metrics=kept)
                )
                entries.append((keys.CHECKPOINT, 1.0, int(step)))
                if staged is not None:
                    self._uploads.append((staged, posixpath.basename(checkpoint.path.rstrip("/"))))
            if not self._closed:
                self._add(entries)
        self._save_journal()
        self._training.set()
        self._wake.set()

    def attempt_ended(self) -> None:
        """A worker group failed: bring the run up to the record of the attempts so far."""
        with self._lock:
            self._tasks.append(self._attempt)
        self._training.set()
        self._wake.set()

    def finish(self, status: str, error: str | None, final_checkpoint: str | None) -> TrackingOutcome:
        """The fit ended: send everything, bring the run up to the record, upload the record's
        segments (and the chosen checkpoints), set the final status. One try per request."""
        with self._lock:
            self._closed = True
            self._journal.status, self._journal.error = status, error
            self._journal.final_checkpoint = final_checkpoint
        self._save_journal()
        self._training.set()  # a sender still waiting for training: let it end
        with self._io:
            try:
                result = self._flush(sync_up_to=None, finished=True)
                return TrackingOutcome(result.run_id if result else None, self._uri, complete=True)
            except Exception as e:
                return TrackingOutcome(
                    self._journal.run_id,
                    self._uri,
                    complete=False,
                    error=f"{type(e).__name__}: {first_line(e)}",
                    pending=len(self._outbox) + len(self._raw) + self._dropped,
                )
            finally:  # staged copies never outlive the fit (see mlflow.md)
                for staged, _ in self._uploads:
                    shutil.rmtree(staged, ignore_errors=True)

    def abandon(self) -> None:
        """The fit's ledger is gone without ending the run: stop, as a writer inside it would
        have stopped with it. The journal in storage keeps the rest (`ray-ormas mlflow-sync`)."""
        with self._lock:
            self._closed = True
            uploads, self._uploads = list(self._uploads), deque()
        self._training.set()
        self._wake.set()
        for staged, _ in uploads:
            shutil.rmtree(staged, ignore_errors=True)

    # ------------------------------------------------------------------ the sender
    def _add(self, entries: list[Entry]) -> None:
        now = int(time.time() * 1000)
        self._outbox.extend((e, now) for e in entries)
        self._trim(self._outbox)

    def _trim(self, queue: deque[Any]) -> None:
        """Hold at most `max_pending` in `queue`: the oldest go (counted; the record has them).
        Called under `_lock`."""
        while len(queue) > self._spec.settings.max_pending:
            queue.popleft()
            self._dropped += 1

    def _run(self) -> None:
        # At a low priority, the imports a sync needs (about 4 CPU-seconds) take what the fit's
        # start-up leaves idle, so a short fit's end does not wait for them. Nothing creates the
        # store or the run before training has started.
        importer = _Importer(self._uri)
        importer.start()
        _yield_cpu_to_training()
        self._training.wait()
        importer.promote()  # training has started: the imports take the writer's own share from now
        from ray_ormas._internal.seams.ormas import OrmasCompatError

        failures = 0
        while True:
            self._wake.wait(timeout=BACKOFF_S[min(failures, len(BACKOFF_S) - 1)] if failures else 1.0)
            self._wake.clear()
            with self._io:
                if self._closed:
                    return
                try:
                    with self._lock:
                        task = self._tasks[0] if self._tasks else None
                    self._flush(sync_up_to=task, finished=False)
                    if task is not None:
                        with self._lock:
                            self._tasks.popleft()
                except OrmasCompatError as e:  # not an outage: say it loudly, once, and stop
                    logger.error("MLflow tracking stopped: %s", e)
                    return
                except Exception as e:
                    failures += 1
                    if self._outage is None:
                        self._outage = f"{type(e).__name__}: {first_line(e)}"
                        logger.warning(
                            "MLflow at %s is unreachable (%s); training goes on, rows wait "
                            "on the head node (up to %d values; the record keeps all) and are sent "
                            "when it answers",
                            shown(self._uri),
                            self._outage,
                            self._spec.settings.max_pending,
                        )
                    continue
                if self._outage is not None:
                    logger.warning("MLflow at %s answers again; the rows that waited are sent", shown(self._uri))
                    self._outage = None
                failures = 0

    def _flush(self, sync_up_to: int | None, finished: bool) -> Any:
        """Send what the outbox holds; then, for a finished attempt (`sync_up_to`) or the whole fit
        (`finished`), what the record and the journal hold that MLflow lacks. The journal is read
        together with the outbox, so nothing is sent twice."""
        self._name_rows()
        client, run_id = self._mlflow()
        with self._lock:
            batch = list(self._outbox)
            journal = self._snapshot()
        for i in range(0, len(batch), 1000):
            chunk = batch[i : i + 1000]
            send_entries(client, run_id, [e for e, _ in chunk], [t for _, t in chunk])
            with self._lock:
                for _ in chunk:
                    self._outbox.popleft()
        while self._uploads:
            staged, name = self._uploads[0]
            upload_folder(client, run_id, pafs.LocalFileSystem(), str(staged), f"checkpoints/{name}")
            shutil.rmtree(staged, ignore_errors=True)
            with self._lock:
                self._uploads.popleft()
        if sync_up_to is None and not finished:
            return None
        result = sync_fit(client, RunRecords(self._spec.store), journal, up_to_attempt=sync_up_to, finished=finished)
        if finished:
            self._dropped = 0
        return result

    def _name_rows(self) -> None:
        """Turn rank 0's rows into (name, value, step) entries in the outbox, in arrival order.
        Only the sender does this (under `_io`), so the namings need no lock."""
        while True:
            with self._lock:
                if not self._raw:
                    return
                prefix, offset, kind, payload, stamp = self._raw.popleft()
            naming = self._namings.get(prefix)
            if naming is None:  # imports mlflow; an OrmasCompatError is loud, at once
                naming = self._namings[prefix] = _naming(prefix)
            entries = naming.entries(kind, {**payload, "step": int(payload.get("step") or 0) + offset})
            with self._lock:
                self._outbox.extend((e, stamp) for e in entries)
                self._trim(self._outbox)

    def _mlflow(self) -> tuple[Any, str]:
        """The client and the run's id, with the run open (created once, its id in the journal)."""
        if self._client is None:
            from mlflow import MlflowClient

            seed_new_store(self._uri)  # a new local SQLite store starts as a copy, not a migration
            self._client = MlflowClient(tracking_uri=self._uri)
        if self._run_id is None:
            with self._lock:
                journal = self._snapshot()
            run_id = open_run(self._client, journal)
            with self._lock:
                self._journal.run_id = run_id
            self._save_journal()
            self._run_id = run_id
            logger.debug("MLflow run %s at %s", run_id, shown(self._uri))
        return self._client, self._run_id

    def _snapshot(self) -> TrackingJournal:
        """A copy of the journal (the caller holds `_lock`, or nothing else writes it yet)."""
        return self._journal.model_copy(deep=True)

    def _save_journal(self) -> None:
        """Write the journal as it is now (the caller must not hold `_lock`)."""
        with self._journal_io:
            with self._lock:
                journal = self._snapshot()
            self._write(journal)

    def _write(self, journal: TrackingJournal) -> None:
        try:
            write_journal(self._spec.store, journal)
        except Exception as e:  # storage trouble is the record's to report; MLflow goes on
            if not self._journal_failed:
                self._journal_failed = True
                logger.warning(
                    "could not write the MLflow journal to %s (%s: %s); the loop's metrics "
                    "reach MLflow only from memory",
                    self._spec.store.shown(),
                    type(e).__name__,
                    e,
                )


def _import_what_a_sync_needs(uri: str) -> None:
    """mlflow's client, its SQL store for a local store, and ormas-monitor (with torch) through
    the seam: imported here, they are no longer imported at the first sync or at the fit's end.
    A failure is left to the first sync, which meets it again and handles it as it always does."""
    try:
        import mlflow  # noqa: F401

        if uri.startswith("sqlite:"):
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        import ray_ormas._internal.seams.ormas  # noqa: F401
    except Exception as e:
        logger.debug("importing ahead of the first sync failed (%s: %s)", type(e).__name__, e)


class _Importer(threading.Thread):
    """`_import_what_a_sync_needs` on a thread of its own that, while the fit starts, takes only
    CPU nothing else wants (SCHED_IDLE, Linux), so the workers' start-up (torch's import, the
    process group) does not share the cores with MLflow's imports; `promote()`, once training
    has started, gives it the writer's own priority (nice 19). Leaving SCHED_IDLE needs
    CAP_SYS_NICE (root in a container has it, Ray's own images' `ray` user does not); where
    it cannot be left, the thread never enters it and imports at nice 19 from the start. It
    holds no lock of the writer's; a sync that needs a module it is still importing waits for that
    module (Python's import lock), as it would import it itself."""

    def __init__(self, uri: str, work: Callable[[str], None] | None = None) -> None:
        super().__init__(name="ray-ormas-mlflow-import", daemon=True)
        self._uri = uri
        self._work = work or _import_what_a_sync_needs
        self._tid: int | None = None
        self._idle = False
        self._lock = threading.Lock()

    def run(self) -> None:
        with self._lock:
            self._tid = threading.get_native_id()
            self._idle = _idle_can_be_left() and _set_policy(self._tid, idle=True)
        if not self._idle:
            _yield_cpu_to_training()
        self._work(self._uri)

    def promote(self) -> None:
        """From SCHED_IDLE to the writer's nice 19 (nothing if it never went idle, or is done)."""
        with self._lock:
            if self._idle and self._tid is not None and self.is_alive():
                self._idle = not _set_policy(self._tid, idle=False)


def _set_policy(tid: int, *, idle: bool) -> bool:
    """Thread `tid` to SCHED_IDLE, or back to SCHED_OTHER at nice 19; False where not allowed."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        if not idle:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    except (AttributeError, OSError):  # not Linux, not allowed, or the thread has ended
        return False
    return True


def _idle_can_be_left() -> bool:
    """Whether a thread of this process may leave SCHED_IDLE again (tried on a thread that ends)."""
    outcome: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        outcome.append(_set_policy(tid, idle=True) and _set_policy(tid, idle=False))

    thread = threading.Thread(target=probe, name="ray-ormas-priority-probe", daemon=True)
    thread.start()
    thread.join(timeout=5)
    return bool(outcome and outcome[0])


def _yield_cpu_to_training() -> None:
    """Lower this thread's CPU priority to the lowest nice value (Linux: a thread is a task with
    its own): where the head node also starts and runs the workers, as on one machine, MLflow's
    imports and syncs yield to them. Ray runs its worker processes at nice 15, so anything
    above 15 would outrank them. Not SCHED_IDLE: a thread that never runs while the cores are
    busy could hold the writer's lock that the fit's last sync (in another thread) waits for."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: run at normal priority
        pass


def stage_for_upload(settings: MLflowSettings, checkpoint: Any) -> Path | None:
    """A local copy of a reported checkpoint (on the head node), to upload when MLflow can take
    it, when `log_checkpoints="all"` (made at once: `num_to_keep` may delete the checkpoint)."""
    if checkpoint is None or settings.log_checkpoints != "all":
        return None
    staged = Path(tempfile.mkdtemp(prefix="ray-ormas-checkpoint-"))
    try:
        pafs.copy_files(
            checkpoint.path,
            str(staged),
            source_filesystem=checkpoint.filesystem,
            destination_filesystem=pafs.LocalFileSystem(),
        )
    except Exception as e:
        shutil.rmtree(staged, ignore_errors=True)
        logger.warning("could not stage checkpoint %s for MLflow (%s: %s)", checkpoint.path, type(e).__name__, e)
        return None
    return staged


def _naming(prefix: str) -> Any:
    from ray_ormas._internal.seams.ormas import MetricNaming  # imports mlflow (through ormas-monitor's MLflowSink)

    return MetricNaming(prefix)
