"""Compatibility with the installed ormas-monitor: small, marked workarounds, each with the
condition under which it switches itself off.

* `flush_metrics`: ormas-monitor 0.2.3 writes `metrics.jsonl` through a buffered file it flushes
  only at `close()`, while it flushes every diary line. A worker killed mid-run left a 0-byte
  `metrics.jsonl` here. ray-ormas flushes that file after every check (one `write` syscall per
  check, none on unsampled steps) and before every upload, so the rows on disk and in storage
  are every row produced. It reads the monitor's private `_metrics` file attribute; if a later
  ormas-monitor renames it, this does nothing, and the tests that SIGKILL a worker and count the
  rows that survived fail, which is how we notice.

* `ShardedGradientMonitor`: under FSDP2 (`torch.distributed.fsdp.fully_shard`) gradients are
  DTensors, and ormas-monitor 0.2.3 crashes at its first check (`.tolist() is not supported for
  tensor subclasses, got DTensor`, in `Monitor._read_scalars`). This subclass replaces that one
  method when the model's gradients are DTensors: each rank sums the squared norms of its local
  shards per layer, one all-reduce per check adds them up over the shards (and only over mesh
  dimensions that shard), and the square roots are the true global gradient norms, read with
  one host transfer. That is better than ormas-monitor's FSDP1 behaviour ("each rank sees
  gradient norms of its own shards; rank 0's are recorded"), and the manifest says so. The loss
  stays rank 0's own, as under DDP. It is a collective, so every rank must run the same checks,
  which is the same contract the monitor has under DDP. It turns itself off when the installed
  ormas-monitor's `_read_scalars` handles DTensors itself (its source mentions them).

* `MetricNaming`: the MLflow metric names and values of a record row or event are ormas-monitor's
  own (`MLflowSink`: `ormas/loss`, `ormas/grad_norm/<layer>`, `ormas/stuck_channels/<layer>`,
  `ormas/stuck_channels_total`, `ormas/events/<event>`). `MLflowSink` sends them with MLflow's
  fluent API, which logs into the process's "active run"; ray-ormas's head-node writer logs
  into one given run, retries, and fills gaps from the record. So the sink's `mlflow` module
  (its private `_mlflow` attribute) is replaced by a recorder that only collects the
  (name, value, step) it would log. Checked when the writer starts, on a known row: if the
  installed ormas-monitor has no such attribute or names a row differently, the writer fails
  loudly (`OrmasCompatError`), never silently logs nothing. It can go when ormas-monitor exposes
  the naming itself (a public `metrics_of(row)` or a sink that takes a client).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from ormas_monitor import Monitor

OWN_FSDP_NOTE = "under FSDP each rank sees gradient norms of its own shards; rank 0's are recorded"
GLOBAL_NORMS_NOTE = ("under FSDP2 ray-ormas records global gradient norms: each rank's squared shard norms are "
                     "summed over the shards by one all-reduce per check (ray_ormas.compat)")


class OrmasCompatError(RuntimeError):
    """The installed ormas-monitor no longer behaves as a ray-ormas workaround expects."""


class _Recorder:
    """Stands in for the `mlflow` module inside MLflowSink: collects what it would log."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, float, int]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.entries += [(k, float(v), int(step)) for k, v in metrics.items()]

    def log_metric(self, key: str, value: float, step: int) -> None:
        self.entries.append((key, float(value), int(step)))


class MetricNaming:
    """ormas-monitor's MLflow names for a row or an event, as (name, value, step) triples."""

    _PROBE = {"step": 7, "loss": 0.5, "grad": {"probe": 2.0}, "stuck": {"probe": [1, 0, 0, 0]}}

    def __init__(self, prefix: str) -> None:
        from ormas_monitor.integrations.sinks import MLflowSink
        self._sink = MLflowSink(prefix=prefix)
        if not hasattr(self._sink, "_mlflow"):
            raise OrmasCompatError(_naming_changed("MLflowSink has no `_mlflow` attribute any more"))
        self._recorder = _Recorder()
        self._sink._mlflow = self._recorder
        got = set(self.entries("metrics", self._PROBE))
        want = {(f"{prefix}/loss", 0.5, 7), (f"{prefix}/grad_norm/probe", 2.0, 7),
                (f"{prefix}/stuck_channels/probe", 1.0, 7), (f"{prefix}/stuck_channels_total", 1.0, 7)}
        if not want <= got or self.entries("event", {"event": "probe", "step": 7}) != [(f"{prefix}/events/probe",
                                                                                        1.0, 7)]:
            raise OrmasCompatError(_naming_changed(f"a probe row was named {sorted(got)}"))

    def entries(self, kind: str, payload: dict[str, Any]) -> list[tuple[str, float, int]]:
        """What MLflowSink would log for `payload` (its step already the run's step)."""
        self._recorder.entries = []
        self._sink(kind, payload)
        return self._recorder.entries


def _naming_changed(what: str) -> str:
    import ormas_monitor
    return (f"ray-ormas takes its MLflow metric names from ormas-monitor's MLflowSink, and the installed "
            f"ormas-monitor {getattr(ormas_monitor, '__version__', '?')} changed it ({what}). Install the "
            f"ormas-monitor version ray-ormas pins (pip install -c constraints/ci.txt ...), or track with "
            f"RayOrmasTrainer(mlflow=False) until ray-ormas is updated")


def flush_metrics(monitor: Any) -> bool:
    """Flush the monitor's metrics file if it is open; True when there was one to flush."""
    handle = getattr(monitor, "_metrics", None)
    if handle is None or getattr(handle, "closed", True) or not callable(getattr(handle, "flush", None)):
        return False
    handle.flush()
    return True


def _is_dtensor(t: Any) -> bool:
    return callable(getattr(t, "to_local", None)) and hasattr(t, "placements")


@functools.lru_cache(maxsize=1)
def ormas_reads_dtensor_gradients() -> bool:
    """Whether the installed ormas-monitor's gradient read handles DTensors (then this layer is off)."""
    try:
        source = inspect.getsource(Monitor._read_scalars)
    except (OSError, TypeError):
        return False
    return any(word in source for word in ("DTensor", "to_local", "full_tensor"))


def monitor_class(model: nn.Module) -> type[Monitor]:
    """The Monitor class for this model: the workaround for DTensor parameters, else ormas's own."""
    if ormas_reads_dtensor_gradients() or not any(_is_dtensor(p) for p in model.parameters()):
        return Monitor
    return ShardedGradientMonitor


class ShardedGradientMonitor(Monitor):
    """ormas-monitor's Monitor with global gradient norms over FSDP2 (DTensor) shards."""

    def _read_scalars(self, loss: torch.Tensor | float | None
                      ) -> tuple[list[str], list[float], float | None, float | None]:
        names, sharded, plain, groups = [], [], [], []
        for name, module in self.modules.items():
            grads = [p.grad for p in module.parameters(recurse=False) if p.grad is not None]
            if not grads:
                continue
            names.append(name)
            zero = torch.zeros((), dtype=torch.float32, device=_device(grads[0]))
            sharded.append(sum((_local_sq(g) for g in grads if _is_dtensor(g)), zero))
            plain.append(sum((_local_sq(g) for g in grads if not _is_dtensor(g)), zero))
            groups += [g for g in grads if _is_dtensor(g)][:1]
        scale, scaled = self._scale_state() if names else (None, False)
        values: list[float] = []
        if names:
            total = torch.stack(sharded)
            if groups:
                for group in _shard_groups(groups[0]):
                    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
            norms = (total + torch.stack(plain)).sqrt()
            if scaled:
                norms = norms / scale
            values = norms.cpu().tolist()
        if isinstance(loss, torch.Tensor):
            loss_val = float(loss.detach().float())
        else:
            loss_val = None if loss is None else float(loss)
        return names, values, loss_val, scale

    def _manifest(self) -> dict[str, Any]:
        manifest = super()._manifest()
        notes = [GLOBAL_NORMS_NOTE if n == OWN_FSDP_NOTE else n for n in manifest.get("notes", [])]
        if GLOBAL_NORMS_NOTE not in notes:
            notes.append(GLOBAL_NORMS_NOTE)
        return {**manifest, "notes": notes}


def _device(t: torch.Tensor) -> torch.device:
    return t.to_local().device if _is_dtensor(t) else t.device


def _local_sq(g: torch.Tensor) -> torch.Tensor:
    local = g.to_local() if _is_dtensor(g) else g
    if local.layout != torch.strided:
        local = local.coalesce().values() if local.layout == torch.sparse_coo else local.values()
    return torch.linalg.vector_norm(local, dtype=torch.float32).square() if local.numel() else \
        torch.zeros((), dtype=torch.float32, device=local.device)


def _shard_groups(grad: Any) -> list[Any]:
    """Process groups of the mesh dimensions along which `grad` is sharded (replicas are not summed)."""
    mesh = grad.device_mesh
    return [mesh.get_group(dim) for dim, placement in enumerate(grad.placements) if placement.is_shard()]
