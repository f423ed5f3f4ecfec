"""Checkpoint and resume helpers: save on rank 0, restore identically on every rank.

    state = ray_ormas.load_checkpoint(model, opt, sampler=sampler)    # None on a fresh start
    start = state.epoch + 1 if state else 0
    for epoch in range(start, epochs):
        ...
        ckpt = ray_ormas.save_checkpoint(model, opt, epoch=epoch, step=step, sampler=sampler)
        ray_ormas.report({"epoch": epoch}, checkpoint=ckpt)            # every rank; ckpt is None off rank 0

This is the classic DDP pattern (save on rank 0, load on all ranks) made safe for FSDP and exact:

* The model and optimizer state go through `torch.distributed.checkpoint.state_dict`
  (`get_state_dict` / `set_state_dict` with full, CPU-offloaded state dicts). The same code saves
  and loads a plain module, DDP, FSDP1 and FSDP2 (`fully_shard`); the saved keys are the
  unwrapped model's, so a checkpoint loads into any of them. Under FSDP the gather is a
  collective: call `save_checkpoint` on every rank.
* Every rank's random state (torch CPU and CUDA, Python `random`, NumPy) is gathered to rank 0
  and each rank gets its own back, so dropout and augmentation continue as if never stopped.
* A `torch.amp.GradScaler`'s state, the epoch and step, the `DistributedSampler`'s epoch (set
  again on load, so the data order of the resumed epoch is the original one), and `extra`
  (any small dict of your own) travel too.

The file is `state.pt`, read back with `torch.load(weights_only=True)`: nothing in it needs pickle.
Without `directory=`, it goes to a temporary folder that `ray_ormas.report` has Ray delete once the
checkpoint is in storage (`delete_local_checkpoint_after_upload`, with either upload mode), so rank
0's disk never holds more than the checkpoint being uploaded; a folder you name is yours to keep or
remove. ray-ormas adds the record pointer to the checkpoint's Ray metadata when it is reported
(record/segments.py). The monitor's own state (its baselines, streaks and certificates) does not
travel: ormas-monitor 0.2.3 has no state_dict, so a resumed attempt starts a fresh monitor in a new
record segment; docs/fault-tolerance.md says what that changes.

Hooks relied on: `ray.train.get_checkpoint` (through worker/resume.py), `ray.train.Checkpoint.from_directory`,
`ray.train.get_context` (rank), `torch.distributed` (gather of the random states).
"""

from __future__ import annotations

import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist
import torch.nn as nn

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.worker.resume import start_checkpoint
from ray_ormas._internal.worker.step_clock import counted_as_checkpoint
from ray_ormas.errors import CheckpointError, CheckpointNotFoundError, OptionError, OptionTypeError

logger = get_logger("ray_ormas.checkpointing")

STATE_FILE = "state.pt"
FORMAT = "ray-ormas-checkpoint/1"
TEMPORARY_PREFIX = "ray-ormas-ckpt-"
_temporary: set[str] = set()  # the folders save_checkpoint made in this process


@dataclass(frozen=True)
class TrainState:
    """What `load_checkpoint` restored besides the tensors: where to continue."""

    epoch: int
    step: int
    extra: dict[str, Any] = field(default_factory=dict)
    checkpoint: ray.train.Checkpoint | None = None


def save_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    epoch: int = 0,
    step: int = 0,
    scaler: Any = None,
    sampler: Any = None,
    extra: dict[str, Any] | None = None,
    directory: str | Path | None = None,
) -> ray.train.Checkpoint | None:
    """Gather the training state and write it on rank 0; call on every rank (a collective under
    FSDP). Returns a `ray.train.Checkpoint` on rank 0 and None elsewhere: pass it on to
    `ray_ormas.report(metrics, checkpoint=...)` on every rank."""
    _check_state_args(model, optimizer, epoch, step, extra)
    with counted_as_checkpoint():  # the goodput account's checkpoint time (worker/step_clock.py)
        return _save(model, optimizer, epoch, step, scaler, sampler, extra, directory)


def _save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    epoch: int,
    step: int,
    scaler: Any,
    sampler: Any,
    extra: dict[str, Any] | None,
    directory: str | Path | None,
) -> ray.train.Checkpoint | None:
    # Imported here, not at the top: torch.distributed.checkpoint costs about 1.5 s of CPU on
    # import, and every worker imports this module (the temporary-folder check) but few save.
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=full)
    optim_state = get_optimizer_state_dict(model, optimizer, options=full) if optimizer is not None else None
    rng = _gather(_rng_state())
    if _rank() != 0:
        return None
    state = {
        "format": FORMAT,
        "epoch": epoch,
        "step": step,
        "model": model_state,
        "optimizer": optim_state,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "sampler_epoch": getattr(sampler, "epoch", None),
        "rng": rng,
        "extra": dict(extra or {}),
    }
    out = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / STATE_FILE)
    if directory is None:
        _temporary.add(str(out))
    return ray.train.Checkpoint.from_directory(str(out))


def is_temporary(checkpoint: ray.train.Checkpoint) -> bool:
    """Whether `checkpoint` is a temporary folder `save_checkpoint` made (not one the caller
    named): ray-ormas has Ray delete it once it is uploaded (worker/session.py)."""
    return checkpoint.path in _temporary


# Ray's `Checkpoint.as_directory` on a node where another process downloaded the same remote
# checkpoint and already deleted its copy (two ranks of one node, loading at different moments)
# raises this; a second try downloads it again.
_DELETED_BY_ANOTHER_PROCESS = "should have been created by another process"
READ_TRIES = 3


def _read_state(checkpoint: ray.train.Checkpoint) -> dict[str, Any]:
    """The saved state of `checkpoint`, read through a local directory (downloaded when remote)."""
    tries = 0
    while True:
        tries += 1
        try:
            with checkpoint.as_directory() as d:
                path = Path(d) / STATE_FILE
                if not path.is_file():
                    raise CheckpointNotFoundError(
                        f"checkpoint {checkpoint.path} has no {STATE_FILE}: it was not written by "
                        f"ray_ormas.save_checkpoint. Load it with your own code, or pass checkpoint=None "
                        f"to start fresh"
                    )
                return dict(torch.load(path, map_location="cpu", weights_only=True))
        except RuntimeError as e:
            if _DELETED_BY_ANOTHER_PROCESS not in str(e) or tries >= READ_TRIES:
                raise
            logger.warning("reading checkpoint %s again: %s", checkpoint.path, e)


def load_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    scaler: Any = None,
    sampler: Any = None,
    checkpoint: ray.train.Checkpoint | None = None,
) -> TrainState | None:
    """Restore what `save_checkpoint` saved, identically on every rank; call on every rank.

    `checkpoint` defaults to `ray.train.get_checkpoint()` (the run's latest, after a restart or
    when the trainer resumes), or, after an alarm's `reattempt` for diverged replicas or a
    non-finite loss, the last checkpoint taken while every check was clean (docs/fleet-health.md).
    Returns None when there is none: a fresh start."""
    checkpoint = checkpoint if checkpoint is not None else start_checkpoint()
    if checkpoint is None:
        return None
    state = _read_state(checkpoint)
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} has format {state.get('format')!r}; this ray-ormas reads {FORMAT!r}"
        )
    from torch.distributed.checkpoint.state_dict import (  # see save_checkpoint
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=full)
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError(f"checkpoint {checkpoint.path} holds no optimizer state; load it with optimizer=None")
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=full)
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if sampler is not None and state["sampler_epoch"] is not None and callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(state["sampler_epoch"])
    _restore_rng(state["rng"])
    return TrainState(epoch=state["epoch"], step=state["step"], extra=state["extra"], checkpoint=checkpoint)


def _check_state_args(model: Any, optimizer: Any, epoch: Any, step: Any, extra: Any) -> None:
    if not isinstance(model, nn.Module):
        raise OptionTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise OptionTypeError(f"optimizer must be a torch.optim.Optimizer (or None), got {type(optimizer).__name__}")
    for name, value in (("epoch", epoch), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OptionError(f"{name} must be an int >= 0, got {value!r}")
    if extra is not None and not isinstance(extra, dict):
        raise OptionTypeError(f"extra must be a dict (or None), got {type(extra).__name__}")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rng_state() -> dict[str, Any]:
    version, mt, gauss = random.getstate()
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [version, list(mt), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    return state


def _restore_rng(states: list[dict[str, Any]]) -> None:
    rank = _rank()
    if rank >= len(states):
        logger.warning(
            "the checkpoint holds random states for %d ranks; rank %d keeps its own (the world size changed)",
            len(states),
            rank,
        )
        return
    state = states[rank]
    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy

        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def _gather(obj: Any) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
