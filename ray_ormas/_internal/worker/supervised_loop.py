"""The built-in training loop of `ray-ormas train`: supervised learning from a config.

Per rank: the model from `model`, the datasets from `data` (a `DistributedSampler` through
`ray.train.torch.prepare_data_loader`, `set_epoch` every epoch), the optimizer, then epochs of
forward, `loss(outputs, targets)`, backward, `mon.step`, optimizer step; with gradient
accumulation (`no_sync` on the micro-steps) and bf16/fp16 autocast (fp16 with a GradScaler given
to the monitor) when the config says so. At the end of every epoch: the validation loss (and
accuracy, for class logits) if there is a validation set, a checkpoint every
`train.checkpoint_every` epochs, and one `ray_ormas.report`. A restarted attempt resumes from
the last checkpoint (`ray_ormas.load_checkpoint`).

Hooks relied on: the worker API of ray-ormas (worker/session.py, worker/strategies.py, worker/checkpointing.py) and
`ray.train.torch.prepare_data_loader` / `get_device`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ray_ormas._internal.common.job_config import JobConfig, load_target
from ray_ormas._internal.worker.api import batch_size, monitor, prepare_model, report
from ray_ormas._internal.worker.checkpointing import load_checkpoint, save_checkpoint
from ray_ormas._internal.worker.strategies import epochs as epoch_range
from ray_ormas._internal.worker.strategies import no_sync
from ray_ormas.errors import OptionTypeError


def supervised_loop(config: dict[str, Any]) -> dict[str, Any]:
    job = JobConfig.from_dict(config)
    if job.model is None or job.data is None:  # the CLI runs this loop only with both
        raise ValueError("the built-in loop needs the config's model and data sections")
    torch.manual_seed(job.train.seed)
    device = ray.train.torch.get_device()
    datasets = job.data.build()
    if not isinstance(datasets, dict) or "train" not in datasets:
        raise OptionTypeError(
            f"data.target {job.data.target} must return {{'train': Dataset, 'val': Dataset or None}}, "
            f"got {type(datasets).__name__}"
        )
    per_rank = batch_size()
    train = ray.train.torch.prepare_data_loader(
        DataLoader(datasets["train"], batch_size=per_rank, shuffle=True, drop_last=True)
    )
    val = datasets.get("val")
    val_loader = ray.train.torch.prepare_data_loader(DataLoader(val, batch_size=per_rank)) if val is not None else None
    model = prepare_model(job.model.build(), parallel_strategy_kwargs=job.parallel_kwargs or None)
    optimizer = getattr(torch.optim, job.optimizer.name)(
        model.parameters(), lr=job.optimizer.lr, **job.optimizer.kwargs
    )
    loss_fn = load_target(job.train.loss) if ":" in job.train.loss else getattr(F, job.train.loss)
    precision = job.train.precision
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    mon = monitor(model, optimizer, scaler=scaler)
    state = load_checkpoint(model, optimizer, scaler=scaler, sampler=train.sampler)
    k = job.train.batch.accumulation
    step = state.step if state else 0
    last_metrics: dict[str, Any] = {}
    for epoch in epoch_range(train, job.train.epochs, start=state.epoch + 1 if state else 0):
        model.train()
        total, batches = torch.zeros((), device=device), 0
        for i, (x, y) in enumerate(train):
            sync = (i + 1) % k == 0
            with no_sync(model, active=not sync):
                with _autocast(device, precision):
                    loss = loss_fn(model(x), y)
                scaled = loss / k
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            mon.micro_step(loss)
            total += loss.detach().float()
            batches += 1
            if sync:
                mon.step()
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad()
                step += 1
        last_metrics = {
            "epoch": epoch,
            "step": step,
            "train_loss": float(total) / max(batches, 1),
            **_evaluate(model, val_loader, loss_fn, device, precision),
        }
        every = job.train.checkpoint_every
        due = every is not None and ((epoch + 1) % every == 0 or epoch + 1 == job.train.epochs)
        checkpoint = (
            save_checkpoint(model, optimizer, epoch=epoch, step=step, scaler=scaler, sampler=train.sampler)
            if due
            else None
        )
        report(last_metrics, checkpoint=checkpoint)
    return last_metrics


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


@torch.no_grad()
def _evaluate(
    model: torch.nn.Module, loader: DataLoader | None, loss_fn: Any, device: torch.device, precision: str
) -> dict[str, float]:
    """This rank's share of the validation set: mean loss, and accuracy for (N, C) logits."""
    if loader is None:
        return {}
    model.eval()
    loss_sum, correct, seen, classes = 0.0, 0, 0, True
    for x, y in loader:
        with _autocast(device, precision):
            out = model(x)
        loss_sum += float(loss_fn(out.float(), y)) * len(y)
        classes = classes and out.dim() == 2 and y.dim() == 1 and not y.is_floating_point()
        if classes:
            correct += int((out.argmax(1) == y).sum())
        seen += len(y)
    model.train()
    metrics = {"val_loss": loss_sum / max(seen, 1)}
    if classes and seen:
        metrics["val_accuracy"] = correct / seen
    return metrics
