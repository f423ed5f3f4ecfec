"""ray-ormas: the Ray Train integration of ormas-monitor.

Driver side, `RayOrmasTrainer(...).fit()`; inside the training loop, three calls:
`ray_ormas.prepare_model(model)`, `mon = ray_ormas.monitor(model, optimizer)` and
`mon.step(loss)` after every backward. `ray_ormas.report(...)` is `ray.train.report` with the
monitor's facts merged in.
"""
from importlib.metadata import PackageNotFoundError, version

from .config import MonitorSettings
from .ledger import RankMismatchError, RankSyncTimeoutError
from .tracking import MLflowSettings
from .trainer import OrmasRun, RayOrmasResult, RayOrmasTrainer
from .worker import WorkerMonitor, monitor, prepare_model, report

try:
    __version__ = version("ray-ormas")
except PackageNotFoundError:      # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
    "MLflowSettings",
    "MonitorSettings",
    "OrmasRun",
    "RankMismatchError",
    "RankSyncTimeoutError",
    "RayOrmasResult",
    "RayOrmasTrainer",
    "WorkerMonitor",
    "__version__",
    "monitor",
    "prepare_model",
    "report",
]
