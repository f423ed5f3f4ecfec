"""Compatibility with the installed ormas-monitor: everything ray-ormas needs beyond its public API,
in one place, each piece checked so that a changed ormas-monitor fails loudly instead of quietly
doing less. `pyproject.toml` admits only the ormas-monitor version CI tests (0.2.3); a release
gets a new pin once these checks and the tests pass against it. docs/architecture.md lists, per
piece, the upstream change that would let it go.

* `MetricNaming` (public API, checked): the MLflow metric names and values of a record row or
  event are ormas-monitor's own (`ormas/loss`, `ormas/grad_norm/<layer>`,
  `ormas/stuck_channels/<layer>`, `ormas/stuck_channels_total`, `ormas/events/<event>`).
  ormas-monitor's sinks write to a live tracker (its MLflowSink to MLflow's "active run");
  ray-ormas's head-node writer logs into one given run, retries, and fills gaps from the record.
  So the names are read from a `TensorBoardSink` given, through its public `writer=` argument, a
  recorder that keeps the (name, value, step) it would write (ormas-monitor's sinks share one
  naming). Checked when the writer starts, on a known row and event: named differently ->
  `OrmasCompatError`.

* `flush_metrics` (a private attribute, only read; checked when rank 0's monitor is built):
  ormas-monitor 0.2.3 writes `metrics.jsonl` through a buffered file it flushes only at
  `close()`, while it flushes every diary line, so a worker killed mid-run left a 0-byte
  `metrics.jsonl`. ray-ormas flushes that file (the monitor's `_metrics`) after every check and
  before every upload. `check_metrics_file`: no such open file -> `OrmasCompatError`.

* `ShardedGradientMonitor` (private methods overridden; checked when a monitor is built for a
  model with DTensor parameters): under FSDP2 (`torch.distributed.fsdp.fully_shard`) gradients
  are DTensors, and ormas-monitor 0.2.3 crashes at its first check (`.tolist() is not supported
  for tensor subclasses, got DTensor`, in `Monitor._read_scalars`). This subclass replaces that
  method: each rank sums the squared norms of its local shards per layer, one all-reduce per
  check adds them up over the shards (and only over mesh dimensions that shard), and the square
  roots are the true global gradient norms, read with one host transfer. Its manifest replaces
  ormas-monitor's FSDP1 note ("each rank sees gradient norms of its own shards") with what is
  recorded instead. It is a collective, so every rank must run the same checks, the contract
  the monitor has under DDP anyway. `check_sharded_gradient_seam`: a method it overrides or calls
  with another signature -> `OrmasCompatError`; the manifest override raises it too when the
  FSDP note it replaces is not there.

* `LossTap` (public methods wrapped on one instance; checked when it is put on): ormas-monitor's
  Transformers callback hands its monitor the step's loss with `Monitor.note_loss(loss)` before
  `Monitor.step()`, and gives it to no one else, while the fleet needs each rank's loss at each
  check. The tap wraps `note_loss` and `step` on that one monitor and keeps the loss either
  received, so the Transformers callback gives its rank's loss to the fleet
  (worker/integrations/transformers.py). A Monitor without a callable `note_loss` or `step`
  taking a loss -> `OrmasCompatError`.

The micro-step loss window (gradient accumulation) is ray-ormas's own (`worker/micro_steps.py`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from ormas_monitor import Monitor

from ray_ormas._internal.record.layout import METRICS
from ray_ormas.errors import OrmasCompatError

OWN_FSDP_NOTE = "under FSDP each rank sees gradient norms of its own shards; rank 0's are recorded"
GLOBAL_NORMS_NOTE = (
    "under FSDP2 ray-ormas records global gradient norms: each rank's squared shard norms are "
    "summed over the shards by one all-reduce per check (ray_ormas._internal.seams.ormas)"
)
PINNED = "ormas-monitor==0.2.3"


def _changed(piece: str, what: str, fallback: str) -> str:
    import ormas_monitor

    return (
        f"ray-ormas {piece}, and the installed ormas-monitor {getattr(ormas_monitor, '__version__', '?')} "
        f"changed it ({what}). Install the version ray-ormas is tested with (pip install '{PINNED}'){fallback}"
    )


# ------------------------------------------------------------------ metric naming
class _Recorder:
    """Stands in for a SummaryWriter given to TensorBoardSink: keeps what it would write."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.entries.append((tag, float(value), int(step)))

    def add_text(self, tag: str, text: str, step: int) -> None:
        pass  # the event's text is in the record, not a metric

    def flush(self) -> None:
        pass


class MetricNaming:
    """ormas-monitor's metric names for a row or an event, as (name, value, step) triples."""

    _PROBE = {"step": 7, "loss": 0.5, "grad": {"probe": 2.0}, "stuck": {"probe": [1, 0, 0, 0]}}

    def __init__(self, prefix: str) -> None:
        from ormas_monitor.integrations.sinks import TensorBoardSink

        self._recorder = _Recorder()
        self._sink = TensorBoardSink(writer=self._recorder, prefix=prefix)
        got = set(self.entries("metrics", self._PROBE))
        want = {
            (f"{prefix}/loss", 0.5, 7),
            (f"{prefix}/grad_norm/probe", 2.0, 7),
            (f"{prefix}/stuck_channels/probe", 1.0, 7),
            (f"{prefix}/stuck_channels_total", 1.0, 7),
        }
        event = self.entries("event", {"event": "probe", "step": 7})
        if not want <= got or event != [(f"{prefix}/events/probe", 1.0, 7)]:
            raise OrmasCompatError(
                _changed(
                    "takes its MLflow metric names from ormas-monitor's sinks",
                    f"a probe row was named {sorted(got)}, an event {event}",
                    ", or track with RayOrmasTrainer(mlflow=False) until ray-ormas is updated",
                )
            )

    def entries(self, kind: str, payload: dict[str, Any]) -> list[tuple[str, float, int]]:
        """What ormas-monitor's sinks would log for `payload` (its step already the run's step)."""
        self._recorder.entries = []
        self._sink(kind, payload)
        return self._recorder.entries


# ------------------------------------------------------------------ the metrics file
def check_metrics_file(monitor: Monitor) -> None:
    """A monitor that writes a record must hold its `metrics.jsonl` open as `_metrics`, or
    `flush_metrics` could not keep the rows of a killed worker."""
    handle = getattr(monitor, "_metrics", None)
    name = getattr(handle, "name", None)
    if (
        handle is None
        or not callable(getattr(handle, "flush", None))
        or getattr(handle, "closed", True)
        or Path(str(name)).name != METRICS
    ):
        raise OrmasCompatError(
            _changed(
                "flushes the monitor's metrics file after every check so that a killed worker keeps its rows",
                f"Monitor._metrics is {handle!r}, not the open metrics.jsonl",
                "",
            )
        )


def flush_metrics(monitor: Monitor) -> bool:
    """Flush the monitor's metrics file if it is open; True when there was one to flush."""
    handle = getattr(monitor, "_metrics", None)
    if handle is None or handle.closed:
        return False
    handle.flush()
    return True


# ------------------------------------------------------------------ FSDP2 gradient norms
# What ShardedGradientMonitor overrides or calls, with ormas-monitor 0.2.3's parameter names.
_SEAM = {"_read_scalars": ["self", "loss"], "_scale_state": ["self"], "_manifest": ["self"]}


def check_sharded_gradient_seam(monitor_type: type = Monitor) -> None:
    """The methods ShardedGradientMonitor overrides or calls exist with the parameters it expects."""
    for method, params in _SEAM.items():
        found = getattr(monitor_type, method, None)
        got = list(inspect.signature(found).parameters) if callable(found) else None
        if got != params:
            raise OrmasCompatError(
                _changed(
                    "computes global gradient norms under FSDP2 by replacing Monitor._read_scalars",
                    f"Monitor.{method} takes {got}, not {params}",
                    ", or train with strategy='ddp'",
                )
            )


def _is_dtensor(t: Any) -> bool:
    return callable(getattr(t, "to_local", None)) and hasattr(t, "placements")


def monitor_class(model: nn.Module) -> type[Monitor]:
    """The Monitor class for this model: the FSDP2 one for DTensor parameters, else ormas's own."""
    if not any(_is_dtensor(p) for p in model.parameters()):
        return Monitor
    check_sharded_gradient_seam()
    return ShardedGradientMonitor


class ShardedGradientMonitor(Monitor):
    """ormas-monitor's Monitor with global gradient norms over FSDP2 (DTensor) shards."""

    def _read_scalars(
        self, loss: torch.Tensor | float | None
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
        loss_val: float | None
        if isinstance(loss, torch.Tensor):
            loss_val = float(loss.detach().float())
        else:
            loss_val = None if loss is None else float(loss)
        return names, values, loss_val, scale

    def _manifest(self) -> dict[str, Any]:
        manifest = super()._manifest()
        notes = list(manifest.get("notes", []))
        if getattr(self, "dist_mode", None) == "fsdp" and OWN_FSDP_NOTE not in notes:
            raise OrmasCompatError(
                _changed(
                    "replaces ormas-monitor's FSDP note in the manifest with what it records instead",
                    f"the manifest's notes are {notes}",
                    ", or train with strategy='ddp'",
                )
            )
        notes = [GLOBAL_NORMS_NOTE if n == OWN_FSDP_NOTE else n for n in notes]
        if GLOBAL_NORMS_NOTE not in notes:
            notes.append(GLOBAL_NORMS_NOTE)
        return {**manifest, "notes": notes}


def _device(t: torch.Tensor) -> torch.device:
    return t.to_local().device if _is_dtensor(t) else t.device


def _local_sq(g: torch.Tensor) -> torch.Tensor:
    local = g.to_local() if _is_dtensor(g) else g
    if local.layout != torch.strided:
        local = local.coalesce().values() if local.layout == torch.sparse_coo else local.values()
    return (
        torch.linalg.vector_norm(local, dtype=torch.float32).square()
        if local.numel()
        else torch.zeros((), dtype=torch.float32, device=local.device)
    )


def _shard_groups(grad: Any) -> list[Any]:
    """Process groups of the mesh dimensions along which `grad` is sharded (replicas are not summed)."""
    mesh = grad.device_mesh
    return [mesh.get_group(dim) for dim, placement in enumerate(grad.placements) if placement.is_shard()]


# ------------------------------------------------------------------ the loss a callback hands its monitor
class LossTap:
    """The loss an integration hands one monitor at a step, through `note_loss(loss)` or
    `step(loss)`; `take()` returns it once (None when the step had none)."""

    def __init__(self, monitor: Monitor) -> None:
        for method in ("note_loss", "step"):
            signature = inspect.signature(getattr(type(monitor), method, None) or (lambda: None))
            if "loss" not in signature.parameters:
                raise OrmasCompatError(
                    _changed(
                        "reads the loss ormas-monitor's Transformers callback gives its monitor",
                        f"Monitor.{method} takes no `loss`",
                        "",
                    )
                )
        self._loss: Any = None
        noted, stepped = monitor.note_loss, monitor.step

        def note_loss(loss: Any) -> None:
            self._loss = loss
            noted(loss)

        def step(loss: Any = None) -> None:
            if loss is not None:
                self._loss = loss
            stepped(loss)

        monitor.note_loss = note_loss
        monitor.step = step

    def take(self) -> Any:
        loss, self._loss = self._loss, None
        return loss
