"""The calls a training loop makes inside a RayOrmasTrainer worker (the public `ray_ormas.*` names).

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

Each call works on this worker's session (session.py); outside a RayOrmasTrainer loop each
raises a `RuntimeError` that says what to use instead. Hooks: `ray.train.torch.prepare_model`
(through worker/strategies.py) and `ray.train.report` (through the session).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ray.train
import torch
import torch.nn as nn

from ray_ormas._internal.record.layout import DEFAULT_MONITOR_NAME, check_monitor_name
from ray_ormas._internal.worker.monitor import WorkerMonitor
from ray_ormas._internal.worker.session import WorkerSession, check_metrics, current_session
from ray_ormas._internal.worker.strategies import prepare
from ray_ormas.errors import OptionTypeError, UsageError


def _session(what: str) -> WorkerSession:
    session = current_session()
    if session is None:
        raise UsageError(
            f"ray_ormas.{what}() works only inside a training loop run by RayOrmasTrainer(...).fit(); "
            f"for a plain ray.train.torch.TorchTrainer use ray.train.torch.prepare_model and "
            f"ormas_monitor.Monitor directly"
        )
    return session


def prepare_model(
    model: nn.Module,
    *,
    move_to_device: bool | torch.device = True,
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """Wrap the model for the trainer's strategy: DDP (Ray's `prepare_model`, after SyncBatchNorm
    conversion if the trainer has `sync_batchnorm=True`) or FSDP2 (`fully_shard`). Call it once
    per independently stepped model (a GAN: once for the generator, once for the discriminator).

    `parallel_strategy_kwargs` go to DDP (e.g. `{"static_graph": True}`) or to `fully_shard`
    (plus `"shard_modules"`: fnmatch patterns of the submodules to shard on their own)."""
    plan = _session("prepare_model").plan
    return prepare(
        model,
        plan.strategy,
        move_to_device=move_to_device,
        parallel_strategy_kwargs=parallel_strategy_kwargs,
        sync_batchnorm=plan.sync_batchnorm,
    )


def batch_size() -> int:
    """This rank's micro-batch size, from the trainer's `batch=ray_ormas.BatchSize(...)`."""
    batch = _session("batch_size").batch
    if batch is None:
        raise UsageError(
            "ray_ormas.batch_size() needs RayOrmasTrainer(batch=ray_ormas.BatchSize(size, per='rank' "
            "or 'global', accumulation=1))"
        )
    return int(batch["per_rank"])


def monitor(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    name: str = DEFAULT_MONITOR_NAME,
    scaler: Any = None,
    sinks: Sequence[Callable[[str, dict], None]] = (),
) -> WorkerMonitor:
    """Build the trainer's `ormas_monitor.Monitor` on this rank; call it the same way on every rank.

    Args:
        model: the prepared (wrapped) model.
        optimizer: the torch optimizer that steps it; required when the trainer repairs.
        name: the monitor's name, and its folder in the record; one per independently
            stepped model (e.g. "generator", "discriminator").
        scaler: the `torch.amp.GradScaler`, if mixed precision uses one.
        sinks: extra ormas-monitor sinks (rank 0 calls them).
    """
    return _session("monitor").add_monitor(model, optimizer, check_monitor_name(name), scaler, sinks).handle


def report(
    metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None = None, *, step: int | None = None, **kwargs: Any
) -> None:
    """`ray.train.report` with ray-ormas facts merged in under `ormas/`. Call it on every rank,
    as often on each, exactly as you would call `ray.train.report`.

    The numeric metrics land in the fit's MLflow run at the run's optimizer step (the main
    monitor's steps plus the step its attempt resumed from), the x-axis of the monitor's own
    curves; `step=` gives another (rank 0's counts). Other keyword arguments go to
    `ray.train.report` (e.g. `checkpoint_dir_name`)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise OptionTypeError(f"step must be an int >= 0 (the MLflow step of these metrics) or None, got {step!r}")
    check_metrics(metrics)
    _session("report").report("user", metrics, checkpoint, step=step, **kwargs)
