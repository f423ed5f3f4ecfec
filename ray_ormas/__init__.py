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

from ray_ormas import errors
from ray_ormas._internal.common.logs import install_default_handler

install_default_handler()

try:
    __version__ = version("ray-ormas")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

_WHERE = {
    # driver: the trainer and what fit() returns
    "OrmasRun": "_internal.driver.result",
    "RayOrmasResult": "_internal.driver.result",
    "RayOrmasTrainer": "_internal.driver.trainer",
    # settings, validated on the driver and shipped to every rank
    "BatchSize": "_internal.common.settings",
    "MonitorSettings": "_internal.common.settings",
    "FleetSettings": "_internal.common.fleet_settings",
    "PreflightSettings": "_internal.common.preflight_settings",
    "FleetAction": "_internal.common.fleet_policy",
    "FleetView": "_internal.common.fleet_policy",
    "FleetAlarm": "_internal.common.fleet_records",
    "RankRow": "_internal.common.fleet_records",
    "MLflowSettings": "_internal.common.mlflow_settings",
    # inside the training loop, on every worker
    "WorkerMonitor": "_internal.worker.monitor",
    "batch_size": "_internal.worker.api",
    "monitor": "_internal.worker.api",
    "prepare_model": "_internal.worker.api",
    "report": "_internal.worker.api",
    "TrainState": "_internal.worker.checkpointing",
    "load_checkpoint": "_internal.worker.checkpointing",
    "save_checkpoint": "_internal.worker.checkpointing",
    "epochs": "_internal.worker.strategies",
    "no_sync": "_internal.worker.strategies",
    # the record, read back anywhere
    "RunRecords": "_internal.record.reader",
    "Segment": "_internal.record.reader",
    "open_records": "_internal.record.reader",
    "RecordStore": "_internal.record.store",
    "FleetSummary": "_internal.record.fleet_record",
    "GoodputAccount": "_internal.record.goodput",
    "RestartCost": "_internal.record.goodput",
    "AttemptGoodput": "_internal.record.goodput",
    # errors
    **{name: "errors" for name in errors.__all__},
}

__all__ = [
    "AttemptGoodput",
    "BatchSize",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "FleetAction",
    "FleetAlarm",
    "FleetReattemptError",
    "FleetSettings",
    "FleetStopError",
    "FleetView",
    "FleetSummary",
    "GoodputAccount",
    "JournalError",
    "MLflowSettings",
    "MissingExtraError",
    "MonitorSettings",
    "OptionError",
    "OptionTypeError",
    "OrmasCompatError",
    "OrmasRun",
    "PreflightSettings",
    "RankMismatchError",
    "RankRow",
    "RankSyncTimeoutError",
    "RayOrmasError",
    "RayOrmasResult",
    "RayOrmasTrainer",
    "RaySeamChanged",
    "RecordStorageError",
    "RecordStore",
    "RestartCost",
    "RunRecords",
    "Segment",
    "StoragePathError",
    "TrainState",
    "UsageError",
    "WorkerMonitor",
    "batch_size",
    "epochs",
    "load_checkpoint",
    "monitor",
    "no_sync",
    "open_records",
    "prepare_model",
    "report",
    "save_checkpoint",
    "__version__",
]


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
    from ray_ormas._internal.common.fleet_policy import FleetAction, FleetView
    from ray_ormas._internal.common.fleet_records import FleetAlarm, RankRow
    from ray_ormas._internal.common.fleet_settings import FleetSettings
    from ray_ormas._internal.common.mlflow_settings import MLflowSettings
    from ray_ormas._internal.common.preflight_settings import PreflightSettings
    from ray_ormas._internal.common.settings import BatchSize, MonitorSettings
    from ray_ormas._internal.driver.result import OrmasRun, RayOrmasResult
    from ray_ormas._internal.driver.trainer import RayOrmasTrainer
    from ray_ormas._internal.record.fleet_record import FleetSummary
    from ray_ormas._internal.record.goodput import AttemptGoodput, GoodputAccount, RestartCost
    from ray_ormas._internal.record.reader import RunRecords, Segment, open_records
    from ray_ormas._internal.record.store import RecordStore
    from ray_ormas._internal.worker.api import batch_size, monitor, prepare_model, report
    from ray_ormas._internal.worker.checkpointing import TrainState, load_checkpoint, save_checkpoint
    from ray_ormas._internal.worker.monitor import WorkerMonitor
    from ray_ormas._internal.worker.strategies import epochs, no_sync
    from ray_ormas.errors import (
        CheckpointError,
        CheckpointNotFoundError,
        ConfigError,
        FleetReattemptError,
        FleetStopError,
        MissingExtraError,
        OptionError,
        OptionTypeError,
        OrmasCompatError,
        RankMismatchError,
        RankSyncTimeoutError,
        RayOrmasError,
        RaySeamChanged,
        RecordStorageError,
        StoragePathError,
        UsageError,
    )
