"""What the driver sends to every worker, and how a monitor not built by the loop is attached.

`WorkerPlan` is built on the driver (driver/trainer.py) and pickled into the function each Ray
Train worker runs (loop.py); `Attach` is how the automatic mode (worker/auto_monitor.py) and the
framework callbacks (integrations/) hand a monitor's construction to the session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ray_ormas._internal.common.preflight_settings import PreflightSettings
from ray_ormas._internal.common.settings import MonitorSettings
from ray_ormas._internal.record.store import RecordStore


@dataclass(frozen=True)
class WorkerPlan:
    """Everything the driver sends to every worker (pickled into the train function)."""

    settings: MonitorSettings
    strategy: str
    store: RecordStore
    run_name: str
    fit_id: str
    ledger: Any
    tracked: bool = False  # the ledger's MLflow writer takes rank 0's rows
    fleet: bool = False  # every rank sends fleet facts at every check
    fleet_acts: bool = False  # an alarm can act (FleetSettings.actions): ranks read the head's orders
    sync_batchnorm: bool = False
    # The batch at each world size the fit may run at (BatchSize.to_dict, or elastic_splits for
    # an elastic range), when the trainer has one
    batches: dict[int, dict[str, Any]] | None = None
    # Ray Train's local mode (the loop runs in the driver): the ledger's controller callback, which
    # no controller calls there, for the session to call (head/ledger_callback.py)
    local_reports: Any = None
    frameworks: tuple[str, ...] = ()  # Lightning / Transformers, if the loop uses them (worker/adoption.py)
    preflight: PreflightSettings | None = None  # the screen before the first step (worker/preflight.py); None: none

    def batch_for(self, world_size: int) -> dict[str, Any] | None:
        """The batch of an attempt at `world_size` (None when the trainer has no `batch=`)."""
        if self.batches is None:
            return None
        if world_size not in self.batches:  # Ray started a size outside the range the driver checked
            raise RuntimeError(
                f"Ray Train started {world_size} workers, and the driver split the batch for "
                f"{sorted(self.batches)} only; this is a bug in ray-ormas or Ray, please report it"
            )
        return self.batches[world_size]


EXPLICIT = "ray_ormas.monitor"  # Attach.by of a monitor the loop built itself


@dataclass(frozen=True)
class Attach:
    """How a monitor is built when not by `ray_ormas.monitor(...)` in the loop: by the automatic
    mode at an optimizer's first step (worker/auto_monitor.py), or by ormas-monitor's own Lightning or
    Transformers callback (worker/integrations/lightning.py, worker/integrations/transformers.py)."""

    by: str = EXPLICIT
    facts: dict[str, Any] | None = None  # written to the segment's link (segment.json) as "attached"
    first_step: int = 0  # loop steps taken before the monitor's step 0
    build: Callable[[dict[str, Any]], Any] | None = None  # builds the Monitor from ray-ormas's keyword arguments
    close: Callable[[], Path | None] | None = None  # closes it the framework's way; returns the report
    exclusive: bool = False  # a framework steps it for every optimizer: nothing else attaches
