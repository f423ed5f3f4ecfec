"""One rank's monitor inside a RayOrmasTrainer worker: the ormas-monitor `Monitor`, its segment
of the record, its report facts, and its fleet probe.

Hooks relied on: `ormas_monitor.Monitor` (built with ray-ormas's sinks, or by a framework
callback through `Attach.build`), the record's store (record/), `ray.get_runtime_context()`
for the node a staging folder lives on, and the run ledger's actor calls (`set_record`,
`add_staging`, `drop_staging`, `fleet_offset`), which it never awaits.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import ray
import torch
import torch.nn as nn

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.fleet_records import Order
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.layout import DIARY, SEGMENT_FILE
from ray_ormas._internal.record.segments import segment_link
from ray_ormas._internal.record.staging import Staging
from ray_ormas._internal.record.uploads import IncrementalUpload
from ray_ormas._internal.seams.ormas import check_metrics_file, flush_metrics, monitor_class
from ray_ormas._internal.worker.fleet_probe import RankProbe
from ray_ormas._internal.worker.micro_steps import MicroStepLosses
from ray_ormas._internal.worker.plan import Attach, WorkerPlan
from ray_ormas._internal.worker.reporting import ProgressPrinter, RecordBuffer, rank0_metrics, rank_facts
from ray_ormas._internal.worker.resume import order_error
from ray_ormas._internal.worker.row_forwarder import RowForwarder
from ray_ormas._internal.worker.step_clock import StepClock

logger = get_logger("ray_ormas.worker")


class Session(Protocol):
    """What a monitor needs of its worker's session (session.py)."""

    plan: WorkerPlan
    rank: int
    world_size: int
    batch: dict[str, Any] | None  # this attempt's split of the trainer's batch
    attempt: int
    token: str
    monitors: dict[str, MonitorRuntime]

    def node(self) -> str: ...

    def resumed_from(self) -> dict[str, Any] | None: ...

    def report(
        self, kind: str, metrics: dict[str, Any], checkpoint: Any, step: int | None = None, **kwargs: Any
    ) -> None: ...


class MonitorRuntime:
    """One rank's monitor as ray-ormas runs it: the `Monitor`, its segment, its sinks, its fleet
    probe, and the protocol the session and the framework callbacks use (`before_step`,
    `after_step`, `persist`, `close`, `metrics`). The loop gets its `handle`."""

    def __init__(
        self,
        session: Session,
        name: str,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scaler: Any,
        sinks: Sequence[Callable[[str, dict], None]],
        *,
        attach: Attach | None = None,
    ) -> None:
        plan = session.plan
        attach = attach or Attach()
        self.name = name
        self.handle = WorkerMonitor(self)
        self.buffer = RecordBuffer()
        self.model = model
        self.optimizer = optimizer
        self.parameter_ids = frozenset(id(p) for p in model.parameters())
        self.attached_by = attach.by
        self.exclusive = attach.exclusive
        self._close_monitor = attach.close
        self._session = session
        self._primary = not session.monitors
        self._prefix = keys.monitor_prefix(name, self._primary)
        self._last_loss: torch.Tensor | float | None = None
        self._window = MicroStepLosses()  # micro-step losses of the current optimizer step
        self._micro_steps = False
        self._closed = False
        self.framework_closed = False  # the framework's callback closed the Monitor (ray-ormas persists later)
        self._report_path: Path | None = None
        self._upload_failed = False  # some upload failed (reported once)
        self._uploaded = False  # the last upload went through
        # Rank 0 only: the segment's path in the store, and the local folder the monitor writes
        # to (the same folder on a local store, a staging folder otherwise).
        self.segment_path: str | None = None
        self.record_dir: Path | None = None
        self.step_offset = 0
        if session.rank == 0:
            self._claim_segment(attach)
        self._upload = (
            IncrementalUpload(plan.store, self.record_dir, self.segment_path)
            if self.record_dir is not None and self.segment_path is not None and not plan.store.is_local
            else None
        )
        self.tracker = (
            RowForwarder(plan.ledger, self._prefix.rstrip("/"), session.attempt, self.step_offset, self._primary)
            if session.rank == 0 and plan.tracked
            else None
        )
        try:
            self.monitor = self._build_monitor(optimizer, scaler, sinks, attach)
        except BaseException:
            self._release_segment()
            raise
        self._tell_the_ledger()
        # Rank 0's main monitor keeps the clock of the goodput account (worker/step_clock.py).
        self.clock = (
            StepClock(model, optimizer, plan.ledger, session.token, self.step_offset)
            if session.rank == 0 and self._primary
            else None
        )
        self._probe: RankProbe | None = None
        if plan.fleet and self._primary:
            if session.rank == 0:
                plan.ledger.fleet_offset.remote(session.token, self.step_offset)
            self._probe = RankProbe(
                model,
                plan.ledger,
                session.token,
                session.rank,
                session.node(),
                session.world_size,
                plan.fleet_acts,
            )

    # ------------------------------------------------------------------ the steps of __init__
    def _claim_segment(self, attach: Attach) -> None:
        """Rank 0: the record's next segment for this monitor, linked to the run (segment.json)."""
        plan, session = self._session.plan, self._session
        link = segment_link(
            plan.store,
            self.name,
            run_name=plan.run_name,
            fit_id=plan.fit_id,
            attempt=session.attempt,
            world_size=session.world_size,
            resumed_from=session.resumed_from(),
        )
        link.update(
            strategy=plan.strategy,
            batch=session.batch,
            metric_prefix=self._prefix.rstrip("/"),
            step_offset=link["step_offset"] + attach.first_step,
        )
        if attach.facts:
            link["attached"] = attach.facts
        self.step_offset = link["step_offset"]
        self.segment_path, self.record_dir = plan.store.claim_segment(self.name, link)

    def _build_monitor(
        self,
        optimizer: torch.optim.Optimizer | None,
        scaler: Any,
        sinks: Sequence[Callable[[str, dict], None]],
        attach: Attach,
    ) -> Any:
        """ormas-monitor's Monitor (or the one the framework's callback builds), with ray-ormas's
        sinks before the user's: the record buffer, rank 0's MLflow rows, the progress line."""
        plan = self._session.plan
        own: list[Callable[[str, dict], None]] = [self.buffer] + ([self.tracker] if self.tracker is not None else [])
        if plan.settings.progress and self._session.rank == 0:
            own.append(ProgressPrinter(self.name))
        kwargs = {
            "out": self.record_dir or Path(plan.store.monitor_dir(self.name)),
            "name": f"{plan.run_name}/{self.name}",
            "sinks": [*own, *sinks],
            **plan.settings.monitor_kwargs(),
        }
        if attach.build is not None:
            monitor = attach.build(kwargs)
        else:
            monitor = monitor_class(self.model)(self.model, optimizer, scaler=scaler, **kwargs)
        if self.record_dir is not None:
            check_metrics_file(monitor)
        return monitor

    def _tell_the_ledger(self) -> None:
        """Rank 0: where the segment is, and on object storage where it is staged (swept at the end)."""
        plan = self._session.plan
        if self.segment_path is None:
            return
        plan.ledger.set_record.remote(self.name, self.segment_path)
        if not plan.store.is_local:
            plan.ledger.add_staging.remote(
                Staging(
                    self.name,
                    self.segment_path,
                    str(self.record_dir),
                    ray.get_runtime_context().get_node_id(),
                    self._session.node(),
                )
            )

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
        except (OSError, ValueError) as e:  # telemetry never breaks training
            logger.warning("could not update %s (%s: %s)", path, type(e).__name__, e)

    def micro_step(self, loss: torch.Tensor | float) -> None:
        """With gradient accumulation: the loss of one micro-batch, as computed (before dividing
        by the accumulation steps). The next `step()` without a loss records the window's mean,
        the objective whose gradient the optimizer step applies. No host sync."""
        self._window.add(loss)
        self._micro_steps = True

    def discard_micro_steps(self) -> None:
        """Forget the micro-step losses taken since the last step (zero-change mode: they may be
        another model's, worker/auto_monitor.py)."""
        self._window = MicroStepLosses()
        self._micro_steps = False

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
        if self.clock is not None:
            self.clock.step_called()
        return self.monitor.checks

    def after_step(self, checks: int, loss: torch.Tensor | float | None) -> None:
        """Right after the monitor's step: the fleet's facts, the row on disk, periodic reports."""
        monitor, probe = self.monitor, self._probe
        if loss is not None:
            # Detached: holding the loss itself would keep this step's autograd graph alive until
            # the next step, and free it inside the next mon.step() instead of where the loop drops it.
            self._last_loss = loss.detach() if isinstance(loss, torch.Tensor) and loss.requires_grad else loss
        clock = self.clock
        if monitor.checks == checks:
            if probe is not None:
                probe.between_steps(monitor.step_count, monitor.check_every)
            if clock is not None:
                clock.step_returned(checked=False)
            return  # an unsampled step: nothing more to do
        if probe is not None:
            probe.checked(monitor.checks - 1, monitor.step_count - 1, loss)
            probe.between_steps(monitor.step_count, monitor.check_every)
        if self.record_dir is not None:
            flush_metrics(monitor)  # the row is on disk before the next step can crash
        if clock is not None:
            clock.step_returned(checked=True)  # the check's reading goes to the head, before an order is raised
        if probe is not None and probe.order is not None:
            raise order_error(probe.order)
        every = self._session.plan.settings.report_every
        if every and self._primary and self.monitor.checks % every == 0:
            self._session.report("periodic", {}, None)

    def order_at_end(self) -> Order | None:
        """The loop ended: the head's order that came after the last check (fleet actions), or None."""
        return self._probe.order_at_end() if self._probe is not None else None

    def persist(self) -> dict[str, Any] | None:
        """Rank 0: bring the segment in storage up to date; return the pointer a checkpoint
        carries (record/segments.py). Other ranks: None. A failed upload is written to the record (a
        `sink_error`) and reported once; training goes on."""
        if self.record_dir is None or self.segment_path is None:
            return None
        if not self.closed:
            flush_metrics(self.monitor)
        try:
            if self._upload is not None and self._closed:
                self._upload.finish()  # object storage: every file whole, once
            elif self._upload is not None:
                self._upload.push()  # object storage: what is new since the last time
            self._uploaded = True
        except Exception as e:  # telemetry never breaks training
            self._uploaded = False
            self._upload_error(e)
        steps = self.monitor.step_count
        return {
            "segment": Path(self.segment_path).name,
            "path": self.segment_path,
            "events": self.buffer.events_written,
            "last_hash": self.buffer.last_hash,
            "metrics_rows": self.buffer.rows_written,
            "steps": steps,
            "run_steps": self.step_offset + steps,
        }

    def _upload_error(self, e: Exception) -> None:
        error = f"{type(e).__name__}: {e}"
        where = self._session.plan.store.shown(self.segment_path)
        if not self._upload_failed:
            logger.warning(
                "could not persist the record of monitor %r to %s (%s); training goes on, the "
                "record is kept at %s on this node and is uploaded again at the next checkpoint and at the "
                "end",
                self.name,
                where,
                error,
                self.record_dir,
            )
        self._upload_failed = True
        diary = self.monitor.diary
        if not self._closed and diary is not None:  # the buffer counts it as a record error
            self.buffer("event", diary.write("sink_error", sink=f"ray-ormas upload to {where}", error=error))
        else:
            self.buffer.record_errors += 1

    def _release_segment(self) -> None:
        """Give back a claimed segment the monitor never started writing (its constructor raised)."""
        if self.record_dir is None or (self.record_dir / DIARY).exists():
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
            started = time.perf_counter()
            self._report_path = self._close_monitor() if self._close_monitor is not None else self.monitor.close()
            if self.clock is not None:
                self.clock.monitor_closed(time.perf_counter() - started)
                self.clock.close()
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
        logger.warning(
            "the record of monitor %r could not be uploaded to %s when training ended; it is "
            "kept whole at %s on node %s, and the driver tries again when the fit ends",
            self.name,
            store.shown(self.segment_path),
            self.record_dir,
            self._session.node(),
        )

    def metrics(self) -> dict[str, Any]:
        """This rank's `ormas/...` facts for a report (rank 0 adds its record rows)."""
        p = self._prefix
        out = rank_facts(p, self._session.rank, self._last_loss, self.model, self.steps)
        if self._session.rank == 0:
            out.update(rank0_metrics(p, self.buffer, self.monitor.counts))
            out[p + keys.CHECKS] = self.monitor.checks
            out[p + keys.RECORD_DIR] = self._session.plan.store.shown(self.segment_path)
            out[p + keys.REPORT_PATH] = (
                self._session.plan.store.shown(f"{self.segment_path}/{self._report_path.name}")
                if self._report_path
                else None
            )
            out[p + keys.STEP_OFFSET] = self.step_offset
            out[p + keys.RECORD_ERRORS] = self.buffer.record_errors
        return out


class WorkerMonitor:
    """One rank's monitor, as the training loop holds it (`ray_ormas.monitor(...)` returns it).

    `step(loss)` once per optimizer step, after backward and before `optimizer.step()`;
    `micro_step(loss)` once per micro-batch under gradient accumulation; `.monitor` is the
    ormas-monitor `Monitor` itself; `.name` and `.steps`. ray-ormas closes it when the loop ends
    (`close()` earlier is allowed: it returns the report's path on rank 0, None elsewhere)."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: MonitorRuntime) -> None:
        self._runtime = runtime

    @property
    def name(self) -> str:
        """The monitor's name: its folder in the record."""
        return self._runtime.name

    @property
    def monitor(self) -> Any:
        """The ormas-monitor `Monitor` on this rank."""
        return self._runtime.monitor

    @property
    def steps(self) -> int:
        """Optimizer steps seen so far."""
        return self._runtime.steps

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Once per optimizer step: after `loss.backward()`, before `optimizer.step()`. With
        gradient accumulation, after the last micro-step's backward, without a loss."""
        self._runtime.step(loss)

    def micro_step(self, loss: torch.Tensor | float) -> None:
        """With gradient accumulation: the loss of one micro-batch, as computed (before dividing
        by the accumulation steps); the next `step()` records the window's mean. No host sync."""
        self._runtime.micro_step(loss)

    def close(self) -> Path | None:
        """Close the monitor now: rank 0 writes `run_end` and the reports and gets the report's
        path; other ranks get None. Idempotent; ray-ormas calls it when the loop ends."""
        return self._runtime.close()

    def __repr__(self) -> str:
        return f"ray_ormas.WorkerMonitor({self.name!r}, steps={self.steps})"
