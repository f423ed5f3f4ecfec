"""Lightning on Ray: ormas-monitor's own Lightning callback, wired to the ray-ormas record.

A `LightningModule` trained through `ray.train.lightning` (`RayDDPStrategy`,
`RayLightningEnvironment`, `prepare_trainer`, `RayTrainReportCallback`) under `RayOrmasTrainer`
gets `RayOrmasLightningCallback` on every rank without a line of change:

* Lightning's `lightning.pytorch.callbacks_factory` entry point (public: Lightning calls every
  registered factory when a `Trainer` is built): ray-ormas's factory (worker/adoption.py) returns this
  callback only inside a RayOrmasTrainer loop with `auto_monitor` on, and nothing elsewhere.
* ormas-monitor's `OrmasMonitorCallback`, extended, not changed: `on_fit_start` builds its
  `Monitor` through ray-ormas (rank 0's segment folder, ray-ormas's sinks, the trainer's
  settings), so there is one record and one MLflow run; `on_before_optimizer_step` is wrapped with
  the fleet's clock before and the row flush, fleet facts and periodic reports after;
  `on_fit_end` / `on_exception` close the monitor as ormas-monitor does, and ray-ormas persists
  the segment when the loop ends. Ray's `RayTrainReportCallback` reports through
  `ray.train.report`, which worker/report_route.py routes through ray-ormas.

Add `RayOrmasLightningCallback(...)` to the trainer's callbacks yourself to choose its options
(`optimizer_index`, `to_loggers`, `name`); the automatic one then stands down. A trainer that
already has ormas-monitor's plain callback keeps it (with its own record) and gets nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray_ormas.errors import MissingExtraError, UsageError

try:
    from ormas_monitor.integrations.lightning import OrmasMonitorCallback
except ImportError as e:
    raise MissingExtraError(f"ray_ormas.lightning needs Lightning: pip install 'ray-ormas[lightning]' ({e})") from e

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.layout import DEFAULT_MONITOR_NAME, check_monitor_name
from ray_ormas._internal.worker.monitor import MonitorRuntime
from ray_ormas._internal.worker.plan import Attach
from ray_ormas._internal.worker.session import current_session

logger = get_logger("ray_ormas.lightning")

ATTACHED_BY = "ormas-monitor's Lightning callback"


class RayOrmasLightningCallback(OrmasMonitorCallback):
    """ormas-monitor's Lightning callback whose monitor is the ray-ormas one of this rank.

    Args:
        optimizer_index: which of `trainer.optimizers` the monitor follows (and repairs).
        to_loggers: also send the monitor's metrics to the trainer's TensorBoard / W&B loggers.
        name: the monitor's name (its folder in the record).
        automatic: set by ray-ormas's entry point for the callback it adds itself; that one
            stands down when the trainer has another ormas-monitor callback (yours wins).

    The monitor's settings (repair, check_every, thresholds, layers) are the trainer's.
    """

    def __init__(
        self,
        *,
        optimizer_index: int = 0,
        to_loggers: bool = False,
        name: str = DEFAULT_MONITOR_NAME,
        automatic: bool = False,
    ) -> None:
        super().__init__(optimizer_index=optimizer_index, to_loggers=to_loggers, write_report=True)
        self.name = check_monitor_name(name)
        self.automatic = automatic
        self.worker: MonitorRuntime | None = None
        self._fits = 0
        self._last_loss: Any = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        session = current_session()
        if session is None:
            raise UsageError(
                "RayOrmasLightningCallback works inside a RayOrmasTrainer loop; elsewhere use "
                "ormas_monitor.integrations.lightning.OrmasMonitorCallback"
            )
        self.worker = None
        if self.automatic and self._stands_down(trainer, session, pl_module):
            return
        self._fits += 1
        name = self.name if self._fits == 1 else session.free_name(f"{self.name}-fit{self._fits}")

        def build(kwargs: dict[str, Any]) -> Any:
            self.monitor_kwargs = kwargs
            OrmasMonitorCallback.on_fit_start(self, trainer, pl_module)
            return self.monitor

        facts = {
            "by": ATTACHED_BY,
            "model": type(pl_module).__name__,
            "optimizer_index": self.optimizer_index,
            "loss": "the loss Lightning backpropagates (on_before_backward)",
        }
        self.worker = session.add_monitor(
            pl_module,
            None,
            name,
            None,
            (),
            Attach(by=ATTACHED_BY, facts=facts, build=build, close=self._close_now, exclusive=True),
        )

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        super().on_before_backward(trainer, pl_module, loss)
        if self.worker is not None:
            self._last_loss = loss.detach()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        worker = self.worker
        if worker is None:
            return
        checks = worker.before_step()
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        worker.after_step(checks, self._last_loss)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_fit_end(trainer, pl_module)
        self._closed_by_lightning()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._closed_by_lightning()

    def _closed_by_lightning(self) -> None:
        if self.worker is not None:
            self.worker.framework_closed = True

    def _close_now(self) -> Path | None:
        """Close the monitor if Lightning has not (ormas-monitor's on_fit_end and on_exception do)."""
        path = self.monitor.close() if self.monitor is not None else None
        return path or self.report

    def _stands_down(self, trainer: Any, session: Any, pl_module: Any) -> bool:
        others = [cb for cb in trainer.callbacks if cb is not self and isinstance(cb, OrmasMonitorCallback)]
        plain = [cb for cb in others if not isinstance(cb, RayOrmasLightningCallback)]
        if plain and session.rank == 0:
            logger.warning(
                "the Lightning trainer already has ormas-monitor's own OrmasMonitorCallback, "
                "which writes its own record (in the trainer's log_dir), outside the ray-ormas record and "
                "MLflow run; ray-ormas attaches nothing more. For one record, replace it with "
                "ray_ormas.lightning.RayOrmasLightningCallback(...), or remove it"
            )
        return bool(others) or session.monitor_of(pl_module) is not None
