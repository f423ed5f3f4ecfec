"""How a model is wrapped for each parallel strategy, and the small helpers loops need around it.

* `ddp`: Ray's `prepare_model(parallel_strategy="ddp")` (DistributedDataParallel), after an
  optional `nn.SyncBatchNorm.convert_sync_batchnorm` (the trainer's `sync_batchnorm=True`).
* `fsdp`: FSDP2, the path torch recommends: `torch.distributed.fsdp.fully_shard` on a 1-D device
  mesh over every rank (CPU/gloo or CUDA/NCCL), applied to each module matching
  `parallel_strategy_kwargs["shard_modules"]` (fnmatch patterns on module names; default: each
  direct child that holds parameters), then to the root. The other kwargs go to `fully_shard`
  (`reshard_after_forward`, `mp_policy`, `offload_policy`). Ray's own FSDP path is FSDP1 and
  refuses to run without CUDA; FSDP2 runs everywhere, so ray-ormas uses it on CPU and GPU alike.
* `no_sync(model, active)`: the context that skips the gradient all-reduce on the micro-steps of
  gradient accumulation (DDP's `no_sync()`, FSDP2's `set_requires_gradient_sync(False)`).
* `epochs(loader, n)`: epoch numbers, with `DistributedSampler.set_epoch` called for you.

Hooks relied on: `ray.train.torch.prepare_model`, `ray.train.torch.get_device`,
`ray.train.get_context`, `torch.distributed.device_mesh.init_device_mesh`,
`torch.distributed.fsdp.fully_shard`.
"""

from __future__ import annotations

import contextlib
import fnmatch
from typing import Any, Iterator

import ray.train
import ray.train.torch
import torch
import torch.nn as nn

from ray_ormas._internal.common.logs import get_logger
from ray_ormas.errors import OptionError

logger = get_logger("ray_ormas.strategies")


def prepare(
    model: nn.Module,
    strategy: str,
    *,
    move_to_device: bool | torch.device = True,
    parallel_strategy_kwargs: dict[str, Any] | None = None,
    sync_batchnorm: bool = False,
) -> nn.Module:
    """Wrap `model` for `strategy` ("ddp" or "fsdp")."""
    if strategy == "fsdp":
        return _fully_shard(model, move_to_device, dict(parallel_strategy_kwargs or {}))
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return ray.train.torch.prepare_model(
        model, move_to_device=move_to_device, parallel_strategy="ddp", parallel_strategy_kwargs=parallel_strategy_kwargs
    )


def _fully_shard(model: nn.Module, move_to_device: bool | torch.device, kwargs: dict[str, Any]) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    patterns = kwargs.pop("shard_modules", None)
    if isinstance(patterns, str):
        patterns = [patterns]
    model = ray.train.torch.prepare_model(model, move_to_device=move_to_device, parallel_strategy=None)
    world = ray.train.get_context().get_world_size()
    mesh = init_device_mesh(ray.train.torch.get_device().type, (world,))
    if patterns is None:
        units = [m for m in model.children() if any(True for _ in m.parameters())]
    else:
        units = [m for name, m in model.named_modules() if name and any(fnmatch.fnmatchcase(name, p) for p in patterns)]
        if not units:
            raise OptionError(
                f"parallel_strategy_kwargs['shard_modules']={patterns!r} matches no module; "
                f"names look like {[n for n, _ in model.named_modules() if n][:6]}"
            )
    units.sort(key=lambda m: -_depth(model, m))  # innermost first, as fully_shard needs
    for unit in units:
        fully_shard(unit, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def _depth(root: nn.Module, module: nn.Module) -> int:
    return next(name.count(".") + 1 for name, m in root.named_modules() if m is module)


@contextlib.contextmanager
def no_sync(model: nn.Module, active: bool = True) -> Iterator[None]:
    """Skip the gradient all-reduce inside this block when `active` (an accumulation micro-step).

    DDP: `model.no_sync()`. FSDP2: `set_requires_gradient_sync(False)`, restored afterwards. Any
    other model: nothing to skip."""
    if not active:
        yield
        return
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if callable(getattr(model, "set_requires_gradient_sync", None)):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def epochs(loader: Any, count: int, start: int = 0) -> Iterator[int]:
    """`range(start, count)`, calling `set_epoch(epoch)` on the loader's sampler (or on `loader`
    itself, if it is a sampler) before each epoch, so every epoch gets its own shuffle on every
    rank. A sampler without `set_epoch` is left alone, and said so once when several ranks share
    the data (one process with a plain shuffling loader reshuffles every epoch by itself)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise OptionError(f"count must be an int >= 0, got {count!r}")
    sampler = loader if callable(getattr(loader, "set_epoch", None)) else getattr(loader, "sampler", None)
    settable = callable(getattr(sampler, "set_epoch", None))
    distributed = (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )
    if not settable and distributed:
        logger.warning(
            "epochs(): %s has no set_epoch(); if it shuffles, every epoch sees the same order. "
            "Use a DistributedSampler (ray.train.torch.prepare_data_loader adds one)",
            type(sampler).__name__,
        )
    for epoch in range(start, count):
        if settable and sampler is not None:
            sampler.set_epoch(epoch)
        yield epoch
