"""What a ray-ormas report carries: rank 0's record rows and small facts from every rank.

`RecordBuffer` is an ormas-monitor sink (`sink(kind, payload)`). ormas-monitor calls sinks on
rank 0 only and only at checks, so it costs nothing on unsampled steps and nothing on other ranks.
It keeps the latest metrics row and counts the events written since the last report;
`rank0_metrics` turns them into flat `ormas/...` keys for `ray.train.report`. A report carries
numbers only (the events themselves are in the record): Ray keeps every report's metrics, and a
report stays a few hundred bytes however eventful the run.

`rank_facts` is what every rank adds: its rank, the loss it last gave the monitor, and a digest
of its parameters, so a reader can see that DDP replicas (and repairs) stayed identical.
Under FSDP2 each rank digests its own shards, so the digests differ between ranks by design.
`parameter_digest` is computed on the parameters' device with one host read: per parameter, two
int64 checksums of the raw bits (plain and position-weighted), then sha256 over names, shapes
and checksums. Any bit that differs between two replicas changes it (barring a checksum
collision, which no real divergence produces); it is not a cryptographic hash of the weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.fleet.digest import parameter_digest

progress = get_logger("ray_ormas.progress")


class ProgressPrinter:
    """Sink that logs one line per check on rank 0 (logger `ray_ormas.progress`, INFO): step, loss,
    alarms, stuck channels, repairs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alarms = 0
        self.repairs = 0

    def __call__(self, kind: str, payload: dict) -> None:
        if kind == "event":
            event = payload.get("event")
            self.alarms += event == "alarm"
            self.repairs += payload.get("count", 0) if event == "repair" else 0
            return
        stuck = payload.get("stuck") or {}
        channels = sum(sum(v) for v in stuck.values())
        layers = sum(1 for v in stuck.values() if sum(v))
        loss = payload.get("loss")
        shown = f"{loss:.4f}" if isinstance(loss, float) else str(loss)
        progress.info(
            f"{self.name} step {payload.get('step'):>6}  loss {shown:>9}  "
            f"alarms {self.alarms:>3}  stuck {channels:>4} ch in {layers} layers  "
            f"repaired {self.repairs:>4} ch"
        )

    def __repr__(self) -> str:
        return f"ray-ormas ProgressPrinter({self.name!r})"


class RecordBuffer:
    """Sink that keeps rank 0's latest metrics row and counts the events since the last report."""

    def __init__(self) -> None:
        self.latest_row: dict[str, Any] | None = None
        self.new_events = 0  # since the last report
        self.certificates = 0
        self.record_errors = 0
        self.rows_written = 0  # metrics rows and diary lines so far: a checkpoint's
        self.events_written = 0  # pointer into the record (see record/segments.py)
        self.last_hash: str | None = None

    def __call__(self, kind: str, payload: dict) -> None:
        if kind == "metrics":
            self.latest_row = payload
            self.rows_written += 1
            return
        self.events_written += 1
        self.last_hash = payload.get("hash", self.last_hash)
        event = payload.get("event")
        if event == "certificate":
            self.certificates += 1
        elif event == "sink_error":
            self.record_errors += 1
        if event not in ("run_start", "run_end"):
            self.new_events += 1

    def take_new_events(self) -> int:
        """The events written since the last call (the last report)."""
        count, self.new_events = self.new_events, 0
        return count

    def __repr__(self) -> str:
        return "ray-ormas RecordBuffer()"


def rank0_metrics(prefix: str, buffer: RecordBuffer, counts: dict[str, int]) -> dict[str, Any]:
    """Flat `ormas/...` keys from rank 0's record: latest row, counts, and how many events the
    record gained since the last report."""
    row = buffer.latest_row or {}
    stuck = row.get("stuck") or {}
    # ormas-monitor's counters first: its `stuck_layers` counts episodes; the key here is the
    # state at this check (layers with stuck channels now), beside `stuck_channels`.
    out: dict[str, Any] = {f"{prefix}{k}": v for k, v in counts.items()}
    out.update(
        {
            prefix + keys.CHECK_STEP: row.get("step"),
            prefix + keys.LOSS: row.get("loss"),
            prefix + keys.STUCK_CHANNELS: sum(sum(v) for v in stuck.values()),
            prefix + keys.STUCK_LAYERS: sum(1 for v in stuck.values() if sum(v)),
            prefix + keys.CERTIFICATES: buffer.certificates,
            prefix + keys.NEW_EVENTS: buffer.take_new_events(),
        }
    )
    return out


def loss_value(loss: torch.Tensor | float | None) -> float | None:
    """A loss as a float (a tensor's mean, read to the host): what every rank reports and what its
    fleet facts carry; None for no loss or an empty tensor."""
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().mean()) if loss.numel() else None
    return None if loss is None else float(loss)


def rank_facts(
    prefix: str, rank: int, last_loss: torch.Tensor | float | None, model: nn.Module, steps: int
) -> dict[str, Any]:
    """Facts every rank reports: rank, its own last loss, its steps, and its parameter digest."""
    return {
        prefix + keys.RANK_LOSS: loss_value(last_loss),
        prefix + keys.RANK_STEPS: steps,
        prefix + keys.PARAM_DIGEST: parameter_digest(model),
    }
