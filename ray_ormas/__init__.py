"""ray-ormas: the Ray Train integration of ormas-monitor.

Driver side, `RayOrmasTrainer(...).fit()`; inside the training loop, three calls:
`ray_ormas.prepare_model(model)`, `mon = ray_ormas.monitor(model, optimizer)` and
`mon.step(loss)` after every backward. `ray_ormas.report(...)` is `ray.train.report` with the
monitor's facts merged in. `ray_ormas.save_checkpoint` / `load_checkpoint` save on rank 0 and
restore on every rank; `ray_ormas.open_records(uri)` reads a run's records back from storage.

The names are imported when first used (PEP 562), so a process that needs only a piece of
ray-ormas (the run ledger and the MLflow writer on the head node, the command line) does not pay
for importing torch and Ray Train.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .logs import install_default_handler

install_default_handler()

try:
    __version__ = version("ray-ormas")
except PackageNotFoundError:      # running from a source tree that was not installed
    __version__ = "0+unknown"

_WHERE = {
    "TrainState": "checkpointing", "load_checkpoint": "checkpointing", "save_checkpoint": "checkpointing",
    "BatchSize": "config", "MonitorSettings": "config",
    "FleetSettings": "fleet_config", "FleetSummary": "fleet_record",
    "RankMismatchError": "ledger", "RankSyncTimeoutError": "ledger",
    "RunRecords": "records", "Segment": "records", "open_records": "records",
    "RecordStorageError": "storage", "RecordStore": "storage",
    "epochs": "strategies", "no_sync": "strategies",
    "MLflowSettings": "tracking",
    "OrmasRun": "trainer", "RayOrmasResult": "trainer", "RayOrmasTrainer": "trainer",
    "WorkerMonitor": "worker", "batch_size": "worker", "monitor": "worker", "prepare_model": "worker",
    "report": "worker",
}

__all__ = sorted([*_WHERE, "__version__"])


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ray_ormas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


if TYPE_CHECKING:
    from .checkpointing import TrainState, load_checkpoint, save_checkpoint
    from .config import BatchSize, MonitorSettings
    from .fleet_config import FleetSettings
    from .fleet_record import FleetSummary
    from .ledger import RankMismatchError, RankSyncTimeoutError
    from .records import RunRecords, Segment, open_records
    from .storage import RecordStorageError, RecordStore
    from .strategies import epochs, no_sync
    from .tracking import MLflowSettings
    from .trainer import OrmasRun, RayOrmasResult, RayOrmasTrainer
    from .worker import WorkerMonitor, batch_size, monitor, prepare_model, report
