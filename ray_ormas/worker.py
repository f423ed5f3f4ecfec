"""What runs inside each Ray Train worker: the three calls a training loop makes, and the session behind them.

    def train_loop(config):
        model = ray_ormas.prepare_model(Net())        # DDP or FSDP, per the trainer's strategy
        opt = torch.optim.AdamW(model.parameters())
        mon = ray_ormas.monitor(model, opt)           # the same Monitor on every rank
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)                            # after backward, before optimizer.step()
            opt.step()
        # no close(): ray-ormas closes the monitor when the loop returns or raises

Hooks relied on:

* `ray.train.torch.prepare_model(parallel_strategy=...)`: wraps the model; the strategy comes
  from the trainer, so the loop does not repeat it.
* `ray.train.get_context()`: world rank and size. ormas-monitor itself detects torch.distributed
  and the DDP wrapper, writes files only on rank 0, and seeds repairs identically on every rank.
* `ray.train.collective.broadcast_from_rank_zero`: once per worker-group attempt, rank 0's token
  for the ledger's meetings (see ledger.py).
* `ray.train.report`: called by ray-ormas only through `ray_ormas.report` (the user's own reports,
  with ray-ormas facts merged in), every `report_every` checks if set, and once when the loop
  returns. Never with a checkpoint of its own, so `Result.metrics` and checkpoint retention stay
  the user's. Every call is preceded by a meeting at the ledger, so uneven ranks raise instead
  of hanging. When some rank reports a checkpoint, rank 0 first persists its record segments to
  the run's storage (storage.py) and adds the record pointer to its checkpoint's metadata
  (`Checkpoint.update_metadata`, see segments.py).
* `ray.train.get_checkpoint`: on rank 0, the checkpoint an attempt resumes from, whose record
  pointer links the new segment to the old.

When the loop raises, every monitor on the rank is closed while the exception propagates (the
record's `run_end` carries the error) and the exception is re-raised unchanged.

A loop that makes none of these calls (written for `TorchTrainer`, or Lightning / Transformers
through Ray) gets its monitors from adoption.py: `WorkerSession.add_monitor` with an `Attach`
saying how (the optimizer step hook, or a framework callback that builds the `Monitor` itself),
and its own `ray.train.report` calls come to `WorkerSession.route_report`.
"""
from __future__ import annotations

import inspect
import json
import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import ray
import ray.train
import torch
import torch.nn as nn

from .checkpointing import is_temporary
from .compat import check_metrics_file, flush_metrics, monitor_class
from .config import DEFAULT_MONITOR_NAME, MonitorSettings, check_monitor_name
from .fleet_probe import RankProbe
from .ledger import RANK_KEY, Arrival, meet
from .ledger_callback import LedgerCallback
from .micro_steps import MicroStepLosses
from .mlflow_writer import RowForwarder
from .reporting import ProgressPrinter, RecordBuffer, rank0_metrics, rank_facts
from .segments import SEGMENT_FILE, segment_link
from .staging import Staging
from .storage import RecordStore
from .strategies import prepare
from .uploads import IncrementalUpload

logger = logging.getLogger(__name__)

_SESSION: WorkerSession | None = None
RANK0_START_GRACE_S = 2.0      # a failing rank waits this long for rank 0 to start closing its record
RANK0_FINISH_GRACE_S = 60.0    # ... and this long for it to finish (run_end, reports, upload)


@dataclass(frozen=True)
class WorkerPlan:
    """Everything the driver sends to every worker (pickled into the train function)."""
    settings: MonitorSettings
    strategy: str
    store: RecordStore
    run_name: str
    fit_id: str
    ledger: Any
    tracked: bool = False                       # the ledger's MLflow writer takes rank 0's rows
    fleet: bool = False                         # every rank sends fleet facts at every check
    sync_batchnorm: bool = False
    batch: dict[str, Any] | None = None         # BatchSize.to_dict(world size), when the trainer has one
    local: bool = False                         # Ray Train's local mode: the loop runs in the driver
    frameworks: tuple[str, ...] = ()            # Lightning / Transformers, if the loop uses them (adoption.py)


EXPLICIT = "ray_ormas.monitor"      # Attach.by of a monitor the loop built itself


@dataclass(frozen=True)
class Attach:
    """How a monitor is built when not by `ray_ormas.monitor(...)` in the loop: by the automatic
    mode at an optimizer's first step (auto_monitor.py), or by ormas-monitor's own Lightning or
    Transformers callback (lightning.py, transformers.py)."""
    by: str = EXPLICIT
    facts: dict[str, Any] | None = None     # written to the segment's link (segment.json) as "attached"
    first_step: int = 0                     # loop steps taken before the monitor's step 0
    build: Callable[[dict[str, Any]], Any] | None = None     # builds the Monitor from ray-ormas's keyword arguments
    close: Callable[[], Path | None] | None = None           # closes it the framework's way; returns the report
    exclusive: bool = False                 # a framework steps it for every optimizer: nothing else attaches


def current_session() -> WorkerSession | None:
    """The ray-ormas session of the loop running in this process, if any."""
    return _SESSION


def _session(what: str) -> WorkerSession:
    if _SESSION is None:
        raise RuntimeError(f"ray_ormas.{what}() works only inside a training loop run by RayOrmasTrainer(...).fit(); "
                           f"for a plain ray.train.torch.TorchTrainer use ray.train.torch.prepare_model and "
                           f"ormas_monitor.Monitor directly")
    return _SESSION


def prepare_model(model: nn.Module, *, move_to_device: bool | torch.device = True,
                  parallel_strategy_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Wrap the model for the trainer's strategy: DDP (Ray's `prepare_model`, after SyncBatchNorm
    conversion if the trainer has `sync_batchnorm=True`) or FSDP2 (`fully_shard`). Call it once
    per independently stepped model (a GAN: once for the generator, once for the discriminator).

    `parallel_strategy_kwargs` go to DDP (e.g. `{"static_graph": True}`) or to `fully_shard`
    (plus `"shard_modules"`: fnmatch patterns of the submodules to shard on their own)."""
    plan = _session("prepare_model").plan
    return prepare(model, plan.strategy, move_to_device=move_to_device,
                   parallel_strategy_kwargs=parallel_strategy_kwargs, sync_batchnorm=plan.sync_batchnorm)


def batch_size() -> int:
    """This rank's micro-batch size, from the trainer's `batch=ray_ormas.BatchSize(...)`."""
    batch = _session("batch_size").plan.batch
    if batch is None:
        raise RuntimeError("ray_ormas.batch_size() needs RayOrmasTrainer(batch=ray_ormas.BatchSize(size, per='rank' "
                           "or 'global', accumulation=1))")
    return int(batch["per_rank"])


def monitor(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, name: str = DEFAULT_MONITOR_NAME,
            scaler: Any = None, sinks: Sequence[Callable[[str, dict], None]] = ()) -> WorkerMonitor:
    """Build the trainer's `ormas_monitor.Monitor` on this rank; call it the same way on every rank.

    Args:
        model: the prepared (wrapped) model.
        optimizer: the torch optimizer that steps it; required when the trainer repairs.
        name: the monitor's name, and its folder in the record; one per independently
            stepped model (e.g. "generator", "discriminator").
        scaler: the `torch.amp.GradScaler`, if mixed precision uses one.
        sinks: extra ormas-monitor sinks (rank 0 calls them).
    """
    return _session("monitor").add_monitor(model, optimizer, check_monitor_name(name), scaler, sinks)


def report(metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None = None, *, step: int | None = None,
           **kwargs: Any) -> None:
    """`ray.train.report` with ray-ormas facts merged in under `ormas/`. Call it on every rank,
    as often on each, exactly as you would call `ray.train.report`.

    The numeric metrics land in the fit's MLflow run at the run's optimizer step (the main
    monitor's steps plus the step its attempt resumed from), the x-axis of the monitor's own
    curves; `step=` gives another (rank 0's counts). Other keyword arguments go to
    `ray.train.report` (e.g. `checkpoint_dir_name`)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"step must be an int >= 0 (the MLflow step of these metrics) or None, got {step!r}")
    _check_metrics(metrics)
    _session("report").report("user", metrics, checkpoint, step=step, **kwargs)


class WorkerMonitor:
    """One rank's monitor. `step(loss)` after backward, before optimizer.step(); `.monitor` is the
    ormas-monitor `Monitor` itself. Closed by ray-ormas when the loop ends."""

    def __init__(self, session: WorkerSession, name: str, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None, scaler: Any,
                 sinks: Sequence[Callable[[str, dict], None]], *, attach: Attach | None = None) -> None:
        plan = session.plan
        attach = attach or Attach()
        self.name = name
        self.buffer = RecordBuffer()
        self.model = model
        self.optimizer = optimizer
        self.parameter_ids = frozenset(id(p) for p in model.parameters())
        self.attached_by = attach.by
        self.exclusive = attach.exclusive
        self._close_monitor = attach.close
        self._session = session
        self._primary = not session.monitors
        self._prefix = "ormas/" if self._primary else f"ormas/{name}/"
        self._last_loss: torch.Tensor | float | None = None
        self._window = MicroStepLosses()    # micro-step losses of the current optimizer step
        self._micro_steps = False
        self._closed = False
        self.framework_closed = False       # the framework's callback closed the Monitor (ray-ormas persists later)
        self._report_path: Path | None = None
        self._upload_failed = False         # some upload failed (reported once)
        self._uploaded = False              # the last upload went through
        # Rank 0 only: the segment's path in the store, and the local folder the monitor writes
        # to (the same folder on a local store, a staging folder otherwise).
        self.segment_path: str | None = None
        self.record_dir: Path | None = None
        self.step_offset = 0
        if session.rank == 0:
            link = segment_link(plan.store, name, run_name=plan.run_name, fit_id=plan.fit_id,
                                attempt=session.attempt, world_size=session.world_size,
                                resumed_from=session.resumed_from())
            link.update(strategy=plan.strategy, batch=plan.batch, metric_prefix=self._prefix.rstrip("/"),
                        step_offset=link["step_offset"] + attach.first_step)
            if attach.facts:
                link["attached"] = attach.facts
            self.step_offset = link["step_offset"]
            self.segment_path, self.record_dir = plan.store.claim_segment(name, link)
        self._upload = (IncrementalUpload(plan.store, self.record_dir, self.segment_path)
                        if self.record_dir is not None and not plan.store.is_local else None)
        self.tracker = (RowForwarder(plan.ledger, self._prefix.rstrip("/"), session.attempt, self.step_offset,
                                     self._primary) if session.rank == 0 and plan.tracked else None)
        own = [self.buffer] + ([self.tracker] if self.tracker is not None else [])
        if plan.settings.progress and session.rank == 0:
            own.append(ProgressPrinter(name))
        kwargs = {"out": self.record_dir or Path(plan.store.monitor_dir(name)), "name": f"{plan.run_name}/{name}",
                  "sinks": [*own, *sinks], **plan.settings.monitor_kwargs()}
        try:
            if attach.build is not None:
                self.monitor = attach.build(kwargs)
            else:
                self.monitor = monitor_class(model)(model, optimizer, scaler=scaler, **kwargs)
            if self.record_dir is not None:
                check_metrics_file(self.monitor)
        except BaseException:
            self._release_segment()
            raise
        if self.segment_path is not None:
            plan.ledger.set_record.remote(name, self.segment_path)
            if not plan.store.is_local:
                plan.ledger.add_staging.remote(Staging(name, self.segment_path, str(self.record_dir),
                                                       ray.get_runtime_context().get_node_id(), session.node()))
        self._probe: RankProbe | None = None
        if plan.fleet and self._primary:
            if session.rank == 0:
                plan.ledger.fleet_offset.remote(session.token, self.step_offset)
            self._probe = RankProbe(model, plan.ledger, session.token, session.rank, session.node())

    @property
    def closed(self) -> bool:
        """Closed by ray-ormas, or by the framework whose callback built it (`framework_closed`)."""
        return self._closed or self.framework_closed

    @property
    def steps(self) -> int:
        """Optimizer steps seen so far."""
        return self.monitor.step_count

    def update_attached(self, **facts: Any) -> None:
        """Rank 0: change how the segment's link (segment.json) says the monitor was attached; it
        reaches storage with the record's next upload."""
        if self.record_dir is None:
            return
        path = self.record_dir / SEGMENT_FILE
        try:
            link = json.loads(path.read_text())
            link["attached"] = {**link.get("attached", {}), **facts}
            path.write_text(json.dumps(link, indent=1, sort_keys=True) + "\n")
        except (OSError, ValueError) as e:     # telemetry never breaks training
            logger.warning("[ray-ormas] could not update %s (%s: %s)", path, type(e).__name__, e)

    def micro_step(self, loss: torch.Tensor | float) -> None:
        """With gradient accumulation: the loss of one micro-batch, as computed (before dividing
        by the accumulation steps). The next `step()` without a loss records the window's mean,
        the objective whose gradient the optimizer step applies. No host sync."""
        self._window.add(loss)
        self._micro_steps = True

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Once per optimizer step: after `loss.backward()`, before `optimizer.step()`. With
        gradient accumulation, after the last micro-step's backward, without a loss."""
        monitor = self.monitor
        if self._micro_steps:
            self._micro_steps = False
            taken = self._window.take_mean(keep_graph=monitor.step_count == 0)
            loss = taken if loss is None else loss
        checks = self.before_step()
        monitor.step(loss)
        self.after_step(checks, loss)

    def before_step(self) -> int:
        """Right before the monitor's own step (a framework callback calls it around the step it
        delegates to ormas-monitor): the fleet's clock; returns the monitor's checks so far."""
        probe = self._probe
        if probe is not None and probe.armed:
            probe.step_called()
        return self.monitor.checks

    def after_step(self, checks: int, loss: torch.Tensor | float | None) -> None:
        """Right after the monitor's step: the fleet's facts, the row on disk, periodic reports."""
        monitor, probe = self.monitor, self._probe
        if loss is not None:
            # Detached: holding the loss itself would keep this step's autograd graph alive until
            # the next step, and free it inside the next mon.step() instead of where the loop drops it.
            self._last_loss = loss.detach() if isinstance(loss, torch.Tensor) and loss.requires_grad else loss
        if monitor.checks == checks:
            if probe is not None and monitor.step_count % monitor.check_every == 0:
                probe.arm()                     # the next step is sampled
            return                              # an unsampled step: nothing more to do
        if probe is not None:
            step = monitor.step_count - 1
            probe.checked(monitor.checks - 1, step, loss)
            if monitor.step_count % monitor.check_every == 0:
                probe.arm()
        if self.record_dir is not None:
            flush_metrics(monitor)              # the row is on disk before the next step can crash
        every = self._session.plan.settings.report_every
        if every and self._primary and self.monitor.checks % every == 0:
            self._session.report("periodic", {}, None)

    def persist(self) -> dict[str, Any] | None:
        """Rank 0: bring the segment in storage up to date; return the pointer a checkpoint
        carries (segments.py). Other ranks: None. A failed upload is written to the record (a
        `sink_error`) and reported once; training goes on."""
        if self.record_dir is None or self.segment_path is None:
            return None
        if not self.closed:
            flush_metrics(self.monitor)
        try:
            if self._upload is not None and self._closed:
                self._upload.finish()               # object storage: every file whole, once
            elif self._upload is not None:
                self._upload.push()                 # object storage: what is new since the last time
            self._uploaded = True
        except Exception as e:              # telemetry never breaks training
            self._uploaded = False
            self._upload_error(e)
        steps = self.monitor.step_count
        return {"segment": Path(self.segment_path).name, "path": self.segment_path,
                "events": self.buffer.events_written, "last_hash": self.buffer.last_hash,
                "metrics_rows": self.buffer.rows_written, "steps": steps, "run_steps": self.step_offset + steps}

    def _upload_error(self, e: Exception) -> None:
        error = f"{type(e).__name__}: {e}"
        where = self._session.plan.store.shown(self.segment_path)
        if not self._upload_failed:
            logger.warning("[ray-ormas] could not persist the record of monitor %r to %s (%s); training goes on, the "
                           "record is kept at %s on this node and is uploaded again at the next checkpoint and at the "
                           "end", self.name, where, error, self.record_dir)
        self._upload_failed = True
        diary = self.monitor.diary
        if not self._closed and diary is not None:       # the buffer counts it as a record error
            self.buffer("event", diary.write("sink_error", sink=f"ray-ormas upload to {where}", error=error))
        else:
            self.buffer.record_errors += 1

    def _release_segment(self) -> None:
        """Give back a claimed segment the monitor never started writing (its constructor raised)."""
        if self.record_dir is None or (self.record_dir / "diary.jsonl").exists():
            return
        store = self._session.plan.store
        try:
            for f in self.record_dir.iterdir():
                f.unlink()
            self.record_dir.rmdir()
            if not store.is_local:
                store.filesystem.delete_dir(self.segment_path)
        except OSError:
            pass

    def close(self) -> Path | None:
        """Close the monitor: rank 0 writes `run_end` and the reports and gets the report's path;
        other ranks get None. Idempotent; ray-ormas calls it when the loop ends."""
        if not self._closed:
            self._closed = True
            self._report_path = self._close_monitor() if self._close_monitor is not None else self.monitor.close()
            if self.record_dir is not None and self.segment_path is not None:
                self.persist()
                self._drop_staging()
        return self._report_path

    def _drop_staging(self) -> None:
        """On object storage, remove the local staging folder once the closed segment is
        uploaded; if the last upload failed, keep it and say where it is."""
        store = self._session.plan.store
        if store.is_local or self.record_dir is None:
            return
        if self._uploaded:
            shutil.rmtree(self.record_dir, ignore_errors=True)
            self._session.plan.ledger.drop_staging.remote(self.segment_path)
            return
        logger.warning("[ray-ormas] the record of monitor %r could not be uploaded to %s when training ended; it is "
                       "kept whole at %s on node %s, and the driver tries again when the fit ends", self.name,
                       store.shown(self.segment_path), self.record_dir, self._session.node())

    def metrics(self) -> dict[str, Any]:
        """This rank's `ormas/...` facts for a report (rank 0 adds its record rows)."""
        p = self._prefix
        out = rank_facts(p, self._session.rank, self._last_loss, self.model, self.steps)
        if self._session.rank == 0:
            out.update(rank0_metrics(p, self.buffer, self.monitor.counts))
            out[f"{p}checks"] = self.monitor.checks
            out[f"{p}record_dir"] = self._session.plan.store.shown(self.segment_path)
            out[f"{p}report_path"] = (self._session.plan.store.shown(f"{self.segment_path}/{self._report_path.name}")
                                      if self._report_path else None)
            out[f"{p}step_offset"] = self.step_offset
            out[f"{p}record_errors"] = self.buffer.record_errors
        return out


class WorkerSession:
    """Per-worker state for one attempt of one `fit()`: the plan, the monitors, the report count."""

    def __init__(self, plan: WorkerPlan) -> None:
        ctx = ray.train.get_context()
        self.plan = plan
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.monitors: dict[str, WorkerMonitor] = {}
        self.reports = 0
        from ray.train.collective import broadcast_from_rank_zero
        self.token: str = broadcast_from_rank_zero(uuid.uuid4().hex if self.rank == 0 else None)
        self.attempt = ray.get(plan.ledger.begin_attempt.remote(self.token), timeout=60) if self.rank == 0 else 0
        self._node: str | None = None
        self._resumed_from: dict[str, Any] | None = None
        self._resume_read = False
        self.report_route: Any = None           # report_route.ReportRoute while the loop's reports are routed

    def node(self) -> str:
        """This worker's node IP address (read once)."""
        if self._node is None:
            self._node = ray.util.get_node_ip_address()
        return self._node

    def resumed_from(self) -> dict[str, Any] | None:
        """The checkpoint this attempt starts from (`ray.train.get_checkpoint()`) and the record
        pointer in its metadata; None on a fresh start. Read once, on rank 0."""
        if not self._resume_read:
            self._resume_read = True
            checkpoint = ray.train.get_checkpoint()
            if checkpoint is not None:
                try:
                    record = checkpoint.get_metadata().get("ormas")
                except Exception:           # a checkpoint without readable metadata still resumes
                    record = None
                self._resumed_from = {"checkpoint": checkpoint.path, "record": record}
        return self._resumed_from

    def add_monitor(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, name: str, scaler: Any,
                    sinks: Sequence[Callable[[str, dict], None]], attach: Attach | None = None) -> WorkerMonitor:
        owner = self.monitor_of(model)
        if owner is not None:
            raise ValueError(_claimed(owner, type(model).__name__))
        if name in self.monitors:
            raise ValueError(f"this rank already has a monitor named {name!r}; give each independently "
                             f"stepped model its own name, e.g. ray_ormas.monitor(disc, opt_d, name='discriminator')")
        if self.plan.settings.repair and optimizer is None and (attach is None or attach.build is None):
            raise ValueError(f"the trainer has repair={self.plan.settings.repair!r}, which needs the optimizer to "
                             f"reset the repaired channels' state: call ray_ormas.monitor(model, optimizer), or "
                             f"use repair=False to watch only")
        mon = WorkerMonitor(self, name, model, optimizer, scaler, sinks, attach=attach)
        self.monitors[name] = mon
        return mon

    def monitor_of(self, model: nn.Module) -> WorkerMonitor | None:
        """The open monitor that already watches some parameter of `model`, if any."""
        ids = {id(p) for p in model.parameters()}
        return next((mon for mon in self.monitors.values() if mon.parameter_ids & ids and not mon.closed), None)

    def free_name(self, preferred: str) -> str:
        """`preferred`, or `preferred-2`, `-3`, ... if a monitor of this rank has it."""
        name, n = preferred, 1
        while name in self.monitors:
            n += 1
            name = f"{preferred}-{n}"
        return name

    def _steps(self) -> int:
        return next(iter(self.monitors.values())).steps if self.monitors else 0

    def run_step(self) -> int | None:
        """The run's optimizer step: the main monitor's steps plus its attempt's `step_offset`."""
        main = next(iter(self.monitors.values()), None)
        return main.step_offset + main.steps if main is not None else None

    def _metrics(self, kind: str, step: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {RANK_KEY: self.rank, "ormas/world_size": self.world_size,
                               "ormas/report_index": self.reports, "ormas/kind": kind,
                               "ormas/run_step": step if step is not None else self.run_step()}
        if self.plan.batch is not None:
            out["ormas/effective_batch"] = self.plan.batch["effective"]
        for mon in self.monitors.values():
            try:
                out.update(mon.metrics())
            except Exception as e:              # telemetry never breaks training
                out[f"{mon._prefix}report_error"] = f"{type(e).__name__}: {e}"
        return out

    def _meet(self, kind: str, checkpoint: bool = False) -> dict[int, Arrival]:
        return meet(self.plan.ledger, self.token, self.reports, self.rank, self.world_size, kind, self._steps(),
                    self.plan.settings.sync_timeout_s, checkpoint)

    def report(self, kind: str, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None,
               step: int | None = None, **kwargs: Any) -> None:
        seen = self._meet(kind, checkpoint is not None)
        if self.rank == 0 and any(a.checkpoint for a in seen.values()):
            # Some rank reports a checkpoint: the record in storage is brought up to it first, and
            # rank 0's checkpoint carries a pointer to the record as of now (segments.py).
            pointers = {name: p for name, mon in self.monitors.items() if (p := mon.persist()) is not None}
            if checkpoint is not None and pointers:
                try:
                    checkpoint.update_metadata({"ormas": pointers})
                except Exception as e:      # the user's checkpoint is reported either way
                    logger.warning("[ray-ormas] could not add the record pointer to the checkpoint's metadata "
                                   "(%s: %s)", type(e).__name__, e)
        payload = {**metrics, **self._metrics(kind, step)}
        self.reports += 1
        if checkpoint is not None and is_temporary(checkpoint):
            kwargs.setdefault("delete_local_checkpoint_after_upload", True)     # rank 0's disk stays clean
        self._ray_report(payload, checkpoint, **kwargs)

    def route_report(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None,
                     kwargs: dict[str, Any]) -> None:
        """The loop's own `ray.train.report(...)` (report_route.py): what `ray_ormas.report` does."""
        _check_metrics(metrics)
        self.report("user", metrics, checkpoint, **kwargs)

    def _ray_report(self, payload: dict[str, Any], checkpoint: ray.train.Checkpoint | None, **kwargs: Any) -> None:
        if self.report_route is not None:
            with self.report_route.passing_through():
                ray.train.report(payload, checkpoint=checkpoint, **kwargs)
        else:
            ray.train.report(payload, checkpoint=checkpoint, **kwargs)
        if self.plan.local:         # no controller calls the ledger's callback: do what it would
            ray.get(LedgerCallback(self.plan.ledger, self.plan.tracked).forward_report([payload], checkpoint),
                    timeout=60)

    def finish(self) -> None:
        """The loop returned on this rank: meet the others, close the monitors, report once more."""
        try:
            seen = self._meet("final")
        except BaseException:
            self.abort()
            raise
        if not self.monitors and self.plan.settings.auto_monitor:
            logger.warning("[ray-ormas] rank %d: no monitor ran: the loop built none, and no optimizer.step() stepped "
                           "a model it called in training mode. Build one with ray_ormas.monitor(model, optimizer) "
                           "(docs/adoption.md)", self.rank)
        steps = {rank: arrival.step for rank, arrival in seen.items()}
        for mon in self.monitors.values():
            try:
                mon.close()
            except Exception as e:               # the record stays as written; training succeeded
                logger.warning("[ray-ormas] rank %d: could not finish the record of monitor %r (%s: %s); "
                               "`ormas-monitor report %s` rebuilds the reports", self.rank, mon.name,
                               type(e).__name__, e, mon.record_dir)
        final = self._metrics("final")
        final["ormas/steps_per_rank"] = [steps[r] for r in sorted(steps)]
        if self.rank == 0 and len(set(steps.values())) > 1:
            logger.warning("[ray-ormas] warning: ranks ran different numbers of monitor steps %s; the record follows "
                           "rank 0, and the replicas may have diverged", final["ormas/steps_per_rank"])
        self.reports += 1
        self._ray_report(final, None)

    def abort(self) -> None:
        """The loop raised on this rank: close every monitor while the exception propagates.

        Rank 0 tells the ledger when it starts and finishes; another rank waits (briefly, see
        ledger.py) for rank 0 to finish its record before the error reaches Ray's teardown."""
        ledger = self.plan.ledger
        if self.rank == 0:
            ledger.rank0_closing.remote(self.token)
        for mon in self.monitors.values():
            try:
                mon.close()     # run_end carries the pending exception; then the segment is persisted
            except Exception as e:
                logger.warning("[ray-ormas] rank %d: could not close monitor %r after the loop failed (%s: %s); the "
                               "loop's own error propagates unchanged", self.rank, mon.name, type(e).__name__, e)
        try:
            if self.rank == 0:
                ray.get(ledger.rank0_closed.remote(self.token), timeout=10)
            else:
                ray.get(ledger.wait_for_rank0.remote(self.token, RANK0_START_GRACE_S, RANK0_FINISH_GRACE_S),
                        timeout=RANK0_START_GRACE_S + RANK0_FINISH_GRACE_S + 10)
        except Exception:       # the ledger is only a courtesy here: the loop's error goes on unchanged
            pass


def _check_metrics(metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    taken = sorted(k for k in metrics if isinstance(k, str) and k.startswith("ormas/"))
    if taken:
        raise ValueError(f"metric names starting with 'ormas/' are reserved for ray-ormas: {taken}; rename them")


def _claimed(owner: WorkerMonitor, model: str) -> str:
    if owner.attached_by != EXPLICIT:
        return (f"two monitors claim one model: {model} is already watched by monitor {owner.name!r}, attached by "
                f"{owner.attached_by}. Call ray_ormas.monitor(model, optimizer) before the model's first "
                f"optimizer.step() (the loop's own monitor then wins and nothing is attached), or leave it out")
    return (f"two monitors claim one model: {model} (or a model sharing its parameters) already has monitor "
            f"{owner.name!r}. Build one monitor per model: ray_ormas.monitor(model, optimizer) once")


def _activate(session: WorkerSession | None) -> None:
    # A module-level function: cloudpickle ships `train_fn` by value with a copy of its globals,
    # so the session must be set through a function that lives in (and writes) the real module.
    global _SESSION
    _SESSION = session


def _accepts_config(fn: Callable[..., Any]) -> bool:
    return bool(inspect.signature(fn).parameters)


def wrap_train_loop(user_fn: Callable[..., Any], plan: WorkerPlan) -> Callable[[dict], Any]:
    """The function TorchTrainer runs on each worker: the user's loop inside a ray-ormas session."""
    takes_config = _accepts_config(user_fn)

    def train_fn(config: dict) -> Any:
        from .adoption import Adoption
        session = WorkerSession(plan)
        _activate(session)
        adoption = Adoption(session)
        try:
            adoption.install()
            try:
                value = user_fn(config) if takes_config else user_fn()
            except BaseException:
                session.abort()
                raise
            session.finish()
            return value
        finally:
            adoption.remove()
            _activate(None)
    # Not functools.wraps: Ray reads the signature (and __wrapped__) to decide whether to pass config.
    train_fn.__name__ = train_fn.__qualname__ = getattr(user_fn, "__name__", "train_loop")
    return train_fn
