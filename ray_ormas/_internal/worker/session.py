"""The per-worker session of one attempt of one `fit()`: the plan, the monitors, the reports.
The loop's calls (worker/api.py) act on it; worker/loop.py opens it and ends it.

Hooks relied on:

* `ray.train.torch.prepare_model(parallel_strategy=...)`: wraps the model; the strategy comes
  from the trainer, so the loop does not repeat it.
* `ray.train.get_context()`: world rank and size. ormas-monitor itself detects torch.distributed
  and the DDP wrapper, writes files only on rank 0, and seeds repairs identically on every rank.
* `ray.train.collective.broadcast_from_rank_zero`: once per worker-group attempt, rank 0's token
  for the ledger's meetings (see head/ledger.py).
* `ray.train.report`: called by ray-ormas only through `ray_ormas.report` (the user's own reports,
  with ray-ormas facts merged in), every `report_every` checks if set, and once when the loop
  returns. Never with a checkpoint of its own, so `Result.metrics` and checkpoint retention stay
  the user's. Every call is preceded by a meeting at the ledger, so uneven ranks raise instead
  of hanging. When some rank reports a checkpoint, rank 0 first persists its record segments to
  the run's storage (record/store.py) and adds the record pointer to its checkpoint's metadata
  (`Checkpoint.update_metadata`, see record/segments.py).
* `ray.train.get_checkpoint`: on rank 0, the checkpoint an attempt resumes from, whose record
  pointer links the new segment to the old.

When the loop raises, every monitor on the rank is closed while the exception propagates (the
record's `run_end` carries the error) and the exception is re-raised unchanged.

A loop that makes none of these calls (written for `TorchTrainer`, or Lightning / Transformers
through Ray) gets its monitors from worker/adoption.py: `WorkerSession.add_monitor` with an `Attach`
saying how (the optimizer step hook, or a framework callback that builds the `Monitor` itself),
and its own `ray.train.report` calls come to `WorkerSession.route_report`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Callable, Sequence

import ray
import ray.train
import torch
import torch.nn as nn

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.meetings import Arrival
from ray_ormas._internal.record.layout import CHECKPOINT_KEY, RESERVED_MONITOR_NAMES
from ray_ormas._internal.record.segments import record_pointer
from ray_ormas._internal.worker.checkpointing import is_temporary
from ray_ormas._internal.worker.monitor import MonitorRuntime
from ray_ormas._internal.worker.plan import EXPLICIT, Attach, WorkerPlan
from ray_ormas._internal.worker.rendezvous import meet
from ray_ormas._internal.worker.resume import order_error, start_checkpoint, use_ledger
from ray_ormas._internal.worker.step_clock import StepClock
from ray_ormas.errors import OptionError, OptionTypeError

logger = get_logger("ray_ormas.worker")

_SESSION: WorkerSession | None = None
RANK0_START_GRACE_S = 2.0  # a failing rank waits this long for rank 0 to start closing its record
RANK0_FINISH_GRACE_S = 60.0  # ... and this long for it to finish (run_end, reports, upload)


def current_session() -> WorkerSession | None:
    """The ray-ormas session of the loop running in this process, if any."""
    return _SESSION


def activate(session: WorkerSession | None) -> None:
    """Make `session` this process's current one (None: end it)."""
    # A module-level function: cloudpickle ships `train_fn` by value with a copy of its globals,
    # so the session must be set through a function that lives in (and writes) the real module.
    global _SESSION
    _SESSION = session


class WorkerSession:
    """Per-worker state for one attempt of one `fit()`: the plan, the monitors, the report count."""

    def __init__(self, plan: WorkerPlan) -> None:
        ctx = ray.train.get_context()
        self.plan = plan
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.batch = plan.batch_for(self.world_size)  # this attempt's split of the trainer's batch
        self.monitors: dict[str, MonitorRuntime] = {}
        self.reports = 0
        from ray.train.collective import broadcast_from_rank_zero

        self.token: str = broadcast_from_rank_zero(uuid.uuid4().hex if self.rank == 0 else None)
        self.attempt = (
            ray.get(plan.ledger.begin_attempt.remote(self.token, self.world_size), timeout=60) if self.rank == 0 else 0
        )
        use_ledger(plan.ledger if plan.fleet_acts else None, self.token)  # a restart may resume from the fleet's choice
        self._node: str | None = None
        self._resumed_from: dict[str, Any] | None = None
        self._resume_read = False
        self.report_route: Any = None  # report_route.ReportRoute while the loop's reports are routed

    def node(self) -> str:
        """This worker's node IP address (read once)."""
        if self._node is None:
            self._node = ray.util.get_node_ip_address()
        return self._node

    @property
    def clock(self) -> StepClock | None:
        """Rank 0's step clock (the main monitor's; None elsewhere, or before a monitor)."""
        main = next(iter(self.monitors.values()), None)
        return main.clock if main is not None else None

    def resumed_from(self) -> dict[str, Any] | None:
        """The checkpoint this attempt starts from (worker/resume.py: Ray's latest, unless an
        alarm's action chose an earlier one) and the record
        pointer in its metadata; None on a fresh start. Read once, on rank 0."""
        if not self._resume_read:
            self._resume_read = True
            checkpoint = start_checkpoint()
            if checkpoint is not None:
                record = record_pointer(checkpoint)  # unreadable metadata: said, and None
                self._resumed_from = {"checkpoint": checkpoint.path, "record": record}
        return self._resumed_from

    def add_monitor(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        name: str,
        scaler: Any,
        sinks: Sequence[Callable[[str, dict], None]],
        attach: Attach | None = None,
    ) -> MonitorRuntime:
        owner = self.monitor_of(model)
        if owner is not None:
            raise OptionError(_claimed(owner, type(model).__name__))
        if name in self.monitors:
            raise OptionError(
                f"this rank already has a monitor named {name!r}; give each independently "
                f"stepped model its own name, e.g. ray_ormas.monitor(disc, opt_d, name='discriminator')"
            )
        if self.plan.settings.repair and optimizer is None and (attach is None or attach.build is None):
            raise OptionError(
                f"the trainer has repair={self.plan.settings.repair!r}, which needs the optimizer to "
                f"reset the repaired channels' state: call ray_ormas.monitor(model, optimizer), or "
                f"use repair=False to watch only"
            )
        mon = MonitorRuntime(self, name, model, optimizer, scaler, sinks, attach=attach)
        self.monitors[name] = mon
        return mon

    def monitor_of(self, model: nn.Module) -> MonitorRuntime | None:
        """The open monitor that already watches some parameter of `model`, if any."""
        ids = {id(p) for p in model.parameters()}
        return next((mon for mon in self.monitors.values() if mon.parameter_ids & ids and not mon.closed), None)

    def free_name(self, preferred: str) -> str:
        """`preferred`, or `preferred-2`, `-3`, ... if a monitor of this rank has it or the record's
        layout reserves it (an auto-named monitor of a model class `Fleet` is `fleet-2`)."""
        name, n = preferred, 1
        while name in self.monitors or name in RESERVED_MONITOR_NAMES:
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
        out: dict[str, Any] = {
            keys.RANK: self.rank,
            keys.WORLD_SIZE: self.world_size,
            keys.REPORT_INDEX: self.reports,
            keys.KIND: kind,
            keys.RUN_STEP: step if step is not None else self.run_step(),
        }
        if self.batch is not None:
            out[keys.EFFECTIVE_BATCH] = self.batch["effective"]
        for mon in self.monitors.values():
            try:
                out.update(mon.metrics())
            except Exception as e:  # telemetry never breaks training
                out[mon._prefix + keys.REPORT_ERROR] = f"{type(e).__name__}: {e}"
        return out

    def _meet(self, kind: str, checkpoint: bool = False) -> dict[int, Arrival]:
        return meet(
            self.plan.ledger,
            self.token,
            self.reports,
            self.rank,
            self.world_size,
            kind,
            self._steps(),
            self.plan.settings.sync_timeout_s,
            checkpoint,
        )

    def report(
        self,
        kind: str,
        metrics: dict[str, Any],
        checkpoint: ray.train.Checkpoint | None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        clock = self.clock
        started = time.perf_counter()
        try:
            self._report(kind, metrics, checkpoint, step, **kwargs)
        finally:
            if clock is not None:
                clock.reporting(time.perf_counter() - started)

    def _report(
        self,
        kind: str,
        metrics: dict[str, Any],
        checkpoint: ray.train.Checkpoint | None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        seen = self._meet(kind, checkpoint is not None)
        if self.rank == 0 and any(a.checkpoint for a in seen.values()):
            # Some rank reports a checkpoint: the record in storage is brought up to it first, and
            # rank 0's checkpoint carries a pointer to the record as of now (record/segments.py).
            pointers = {name: p for name, mon in self.monitors.items() if (p := mon.persist()) is not None}
            if checkpoint is not None and pointers:
                try:
                    checkpoint.update_metadata({CHECKPOINT_KEY: pointers})
                except Exception as e:  # the user's checkpoint is reported either way
                    logger.warning(
                        "could not add the record pointer to the checkpoint's metadata (%s: %s)",
                        type(e).__name__,
                        e,
                    )
        payload = {**metrics, **self._metrics(kind, step)}
        self.reports += 1
        if checkpoint is not None and is_temporary(checkpoint):
            kwargs.setdefault("delete_local_checkpoint_after_upload", True)  # rank 0's disk stays clean
        self._ray_report(payload, checkpoint, **kwargs)

    def route_report(
        self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None, kwargs: dict[str, Any]
    ) -> None:
        """The loop's own `ray.train.report(...)` (worker/report_route.py): what `ray_ormas.report` does."""
        check_metrics(metrics)
        self.report("user", metrics, checkpoint, **kwargs)

    def _ray_report(self, payload: dict[str, Any], checkpoint: ray.train.Checkpoint | None, **kwargs: Any) -> None:
        if self.report_route is not None:
            with self.report_route.passing_through():
                ray.train.report(payload, checkpoint=checkpoint, **kwargs)
        else:
            ray.train.report(payload, checkpoint=checkpoint, **kwargs)
        if self.plan.local_reports is not None:  # no controller calls the ledger's callback: do what it would
            ray.get(self.plan.local_reports.forward_report([payload], checkpoint), timeout=60)

    def finish(self) -> None:
        """The loop returned on this rank: meet the others, close the monitors, report once more.

        When an alarm can act, an order the head gave after the ranks' last check (an alarm at that
        check, or a `diagnose` that was still capturing stacks) is raised here on every rank, as it
        would have been at a next check: the restart or the stop still happens.

        If the run ledger is gone by then, the fit is being ended from outside after the loop
        ended (a Ray Tune scheduler's stop at the last report kills the trial's driver, and the
        ledger with it): the monitors close as the loop ended (a run_end without an error) and
        the final report, which nothing would receive, is skipped."""
        gone: str | None = None
        loop_ended = time.perf_counter()
        if self.clock is not None:
            self.clock.loop_ended()
        try:
            seen = self._meet("final")
        except ray.exceptions.RayActorError as e:
            gone = type(e).__name__  # closed below, outside this handler: ormas-monitor reads a pending error
        except BaseException:
            self.abort()
            raise
        if gone is not None:
            self._close_after_the_fit_was_ended(gone)
            return
        order = next((o for mon in self.monitors.values() if (o := mon.order_at_end()) is not None), None)
        if order is not None:  # an action asked after the last check: carried out here, as at a check
            try:
                raise order_error(order)
            except BaseException:
                self.abort()
                raise
        if not self.monitors and self.plan.settings.auto_monitor:
            logger.warning(
                "no monitor ran: the loop built none, and no optimizer.step() stepped "
                "a model it called in training mode. Build one with ray_ormas.monitor(model, optimizer) "
                "(docs/adoption.md)",
                rank=self.rank,
            )
        steps = {rank: arrival.step for rank, arrival in seen.items()}
        for mon in self.monitors.values():
            try:
                mon.close()
            except Exception as e:  # the record stays as written; training succeeded
                logger.warning(
                    "could not finish the record of monitor %r (%s: %s); "
                    "`ormas-monitor report %s` rebuilds the reports",
                    mon.name,
                    type(e).__name__,
                    e,
                    mon.record_dir,
                    rank=self.rank,
                )
        clock = self.clock
        if clock is not None:  # the attempt's last reading: the loop's end, and the record's close
            clock.send(ended=True, closing_s=time.perf_counter() - loop_ended)
        final = self._metrics("final")
        final[keys.STEPS_PER_RANK] = [steps[r] for r in sorted(steps)]
        if self.rank == 0 and len(set(steps.values())) > 1:
            logger.warning(
                "warning: ranks ran different numbers of monitor steps %s; the record follows "
                "rank 0, and the replicas may have diverged",
                final[keys.STEPS_PER_RANK],
            )
        self.reports += 1
        self._ray_report(final, None)

    def _close_after_the_fit_was_ended(self, error: str) -> None:
        if self.rank == 0:
            logger.warning(
                "the run ledger is gone after the loop ended (%s): the fit is being ended from outside "
                "(a Ray Tune scheduler's stop at the last report, or the driver ended). The record "
                "closes as the loop ended; `ray-ormas mlflow-sync %s` brings the MLflow run and run.html "
                "up to it",
                error,
                self.plan.store.shown(),
                rank=self.rank,
            )
        for mon in self.monitors.values():
            try:
                mon.close()
            except Exception as e:  # the record stays as written
                logger.warning(
                    "could not finish the record of monitor %r (%s: %s)", mon.name, type(e).__name__, e, rank=self.rank
                )

    def abort(self) -> None:
        """The loop raised on this rank: close every monitor while the exception propagates.

        Rank 0 tells the ledger when it starts and finishes; another rank waits (briefly, see
        head/ledger.py) for rank 0 to finish its record before the error reaches Ray's teardown."""
        ledger = self.plan.ledger
        if self.rank == 0:
            ledger.rank0_closing.remote(self.token)
            if self.clock is not None:
                self.clock.send()  # where the attempt stood when it failed
        main = next(iter(self.monitors.values()), None)
        if main is not None:  # when and at which step the failure was seen (the goodput account)
            with contextlib.suppress(Exception):
                ledger.goodput_failure.remote(self.token, main.steps)
        for mon in self.monitors.values():
            try:
                mon.close()  # run_end carries the pending exception; then the segment is persisted
            except Exception as e:
                logger.warning(
                    "could not close monitor %r after the loop failed (%s: %s); the "
                    "loop's own error propagates unchanged",
                    mon.name,
                    type(e).__name__,
                    e,
                    rank=self.rank,
                )
        try:
            if self.rank == 0:
                ray.get(ledger.rank0_closed.remote(self.token), timeout=10)
            else:
                ray.get(
                    ledger.wait_for_rank0.remote(self.token, RANK0_START_GRACE_S, RANK0_FINISH_GRACE_S),
                    timeout=RANK0_START_GRACE_S + RANK0_FINISH_GRACE_S + 10,
                )
        except Exception:  # the ledger is only a courtesy here: the loop's error goes on unchanged
            pass


def check_metrics(metrics: Any) -> None:
    """Refuse what `ray.train.report` would take but ray-ormas cannot merge its facts into."""
    if not isinstance(metrics, dict):
        raise OptionTypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    taken = sorted(k for k in metrics if keys.is_ormas(k))
    if taken:
        raise OptionError(f"metric names starting with 'ormas/' are reserved for ray-ormas: {taken}; rename them")


def _claimed(owner: MonitorRuntime, model: str) -> str:
    if owner.attached_by != EXPLICIT:
        return (
            f"two monitors claim one model: {model} is already watched by monitor {owner.name!r}, attached by "
            f"{owner.attached_by}. Call ray_ormas.monitor(model, optimizer) before the model's first "
            f"optimizer.step() (the loop's own monitor then wins and nothing is attached), or leave it out"
        )
    return (
        f"two monitors claim one model: {model} (or a model sharing its parameters) already has monitor "
        f"{owner.name!r}. Build one monitor per model: ray_ormas.monitor(model, optimizer) once"
    )
