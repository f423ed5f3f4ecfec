"""ray-ormas: the Ray Train integration of ormas-monitor.

Driver side, `RayOrmasTrainer(...).fit()`; inside the training loop, three calls:
`ray_ormas.prepare_model(model)`, `mon = ray_ormas.monitor(model, optimizer)` and
`mon.step(loss)` after every backward. `ray_ormas.report(...)` is `ray.train.report` with the
monitor's facts merged in. `ray_ormas.save_checkpoint` / `load_checkpoint` save on rank 0 and
restore on every rank; `ray_ormas.open_records(uri)` reads a run's records back from storage.
"""
from importlib.metadata import PackageNotFoundError, version

from .checkpointing import TrainState, load_checkpoint, save_checkpoint
from .config import BatchSize, MonitorSettings
from .ledger import RankMismatchError, RankSyncTimeoutError
from .records import RunRecords, Segment, open_records
from .storage import RecordStorageError, RecordStore
from .strategies import epochs, no_sync
from .tracking import MLflowSettings
from .trainer import OrmasRun, RayOrmasResult, RayOrmasTrainer
from .worker import WorkerMonitor, batch_size, monitor, prepare_model, report

try:
    __version__ = version("ray-ormas")
except PackageNotFoundError:      # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
    "BatchSize",
    "MLflowSettings",
    "MonitorSettings",
    "OrmasRun",
    "RankMismatchError",
    "RankSyncTimeoutError",
    "RayOrmasResult",
    "RayOrmasTrainer",
    "RecordStorageError",
    "RecordStore",
    "RunRecords",
    "Segment",
    "TrainState",
    "WorkerMonitor",
    "__version__",
    "batch_size",
    "epochs",
    "load_checkpoint",
    "monitor",
    "no_sync",
    "open_records",
    "prepare_model",
    "report",
    "save_checkpoint",
]
