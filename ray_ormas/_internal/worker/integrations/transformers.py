"""Hugging Face Transformers on Ray: ormas-monitor's own Transformers callback, wired to the ray-ormas record.

A `transformers.Trainer` run through `ray.train.huggingface.transformers.prepare_trainer` under
`RayOrmasTrainer` gets `RayOrmasTransformersCallback` on every rank without a line of change.

Hooks relied on:

* `transformers.Trainer.train`, wrapped for the length of a RayOrmasTrainer loop in its worker
  process only (`TrainerHook`): before the original runs, the callback is added with the public
  `Trainer.add_callback`. Transformers has no public way to add a callback to trainers it did
  not build (Lightning has entry points, see worker/integrations/lightning.py); the wrapper is installed and removed
  by the session and checks that it wraps a callable `train`.
* ormas-monitor's Transformers `OrmasMonitorCallback`, extended, not changed: `on_train_begin`
  builds its `Monitor` through ray-ormas (rank 0's segment folder, ray-ormas's sinks, the
  trainer's settings); `on_pre_optimizer_step` is wrapped with the fleet's clock before and the
  row flush, fleet facts (with the loss the callback handed its monitor, seams/ormas.py
  `LossTap`) and periodic reports after; `on_train_end` closes the monitor as
  ormas-monitor does. When training raises, ray-ormas closes it (`close()`), since the Trainer
  has no exception hook. Ray's `RayTrainReportCallback` reports through `ray.train.report`,
  routed through ray-ormas (worker/report_route.py).

Add `RayOrmasTransformersCallback(...)` yourself (`trainer.add_callback`) to choose its options;
the automatic one is then not added. A trainer that already has ormas-monitor's plain callback
keeps it (with its own record) and gets nothing more.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ray_ormas.errors import MissingExtraError, UsageError

try:
    import transformers
    from ormas_monitor.integrations.huggingface import OrmasMonitorCallback
except ImportError as e:
    raise MissingExtraError(
        f"ray_ormas.transformers needs Transformers: pip install 'ray-ormas[transformers]' ({e})"
    ) from e

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.layout import DEFAULT_MONITOR_NAME, check_monitor_name
from ray_ormas._internal.seams.ormas import LossTap
from ray_ormas._internal.worker.monitor import MonitorRuntime
from ray_ormas._internal.worker.plan import Attach
from ray_ormas._internal.worker.session import current_session

logger = get_logger("ray_ormas.transformers")

ATTACHED_BY = "ormas-monitor's Transformers callback"


class RayOrmasTransformersCallback(OrmasMonitorCallback):
    """ormas-monitor's Transformers callback whose monitor is the ray-ormas one of this rank.

    Args:
        to_loggers: also send the monitor's metrics to the trackers in `args.report_to`.
        name: the monitor's name (its folder in the record).

    The monitor's settings (repair, check_every, thresholds, layers) are the trainer's. The loss
    is the one the model returns (see ormas-monitor's callback); `note_loss(loss)` gives one
    computed outside the model.
    """

    def __init__(self, *, to_loggers: bool = False, name: str = DEFAULT_MONITOR_NAME) -> None:
        super().__init__(to_loggers=to_loggers, write_report=True)
        self.name = check_monitor_name(name)
        self.worker: MonitorRuntime | None = None
        self._loss_tap: LossTap | None = None
        self._trainings = 0

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        session = current_session()
        if session is None:
            raise UsageError(
                "RayOrmasTransformersCallback works inside a RayOrmasTrainer loop; elsewhere use "
                "ormas_monitor.integrations.huggingface.OrmasMonitorCallback"
            )
        self.worker = None
        if model is None or session.monitor_of(model) is not None:
            return  # the loop's own monitor wins
        self._trainings += 1
        name = self.name if self._trainings == 1 else session.free_name(f"{self.name}-train{self._trainings}")

        def build(monitor_kwargs: dict[str, Any]) -> Any:
            self.monitor_kwargs = monitor_kwargs
            OrmasMonitorCallback.on_train_begin(self, args, state, control, model=model, optimizer=optimizer, **kwargs)
            self._loss_tap = LossTap(self.monitor)  # the rank's loss, for the fleet
            return self.monitor

        facts = {
            "by": ATTACHED_BY,
            "model": type(model).__name__,
            "loss": "the loss the model returns (outputs.loss), or note_loss(...)",
        }
        self.worker = session.add_monitor(
            model,
            None,
            name,
            None,
            (),
            Attach(by=ATTACHED_BY, facts=facts, build=build, close=self._close_now, exclusive=True),
        )

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        worker = self.worker
        if worker is None:
            return
        checks = worker.before_step()
        super().on_pre_optimizer_step(args, state, control, **kwargs)
        worker.after_step(checks, self._loss_tap.take() if self._loss_tap is not None else None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_end(args, state, control, **kwargs)
        if self.worker is not None:
            self.worker.framework_closed = True

    def _close_now(self) -> Path | None:
        self.close()
        return self.report


def _has_ormas_callback(trainer: Any) -> bool:
    """Add the automatic callback unless the trainer has an ormas-monitor callback already."""
    callbacks = list(getattr(getattr(trainer, "callback_handler", None), "callbacks", []))
    plain = [
        cb
        for cb in callbacks
        if isinstance(cb, OrmasMonitorCallback) and not isinstance(cb, RayOrmasTransformersCallback)
    ]
    session = current_session()
    if plain and session is not None and session.rank == 0:
        logger.warning(
            "the Transformers trainer already has ormas-monitor's own OrmasMonitorCallback, "
            "which writes its own record (in args.output_dir), outside the ray-ormas record and MLflow "
            "run; ray-ormas adds nothing. For one record, replace it with "
            "ray_ormas.transformers.RayOrmasTransformersCallback(...), or remove it"
        )
    return any(isinstance(cb, OrmasMonitorCallback) for cb in callbacks)


class TrainerHook:
    """Adds the callback to every `transformers.Trainer` whose `train()` runs in this process
    between `install()` and `remove()` (see the module docstring)."""

    def __init__(self) -> None:
        self._original: Any = None

    def install(self) -> None:
        original = transformers.Trainer.train
        if not callable(original):
            raise UsageError(
                f"transformers.Trainer.train is not a method in transformers "
                f"{transformers.__version__}; ray-ormas cannot add its callback"
            )
        self._original = original

        @functools.wraps(original)
        def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            if current_session() is not None and not _has_ormas_callback(trainer):
                trainer.add_callback(RayOrmasTransformersCallback())
            return original(trainer, *args, **kwargs)

        transformers.Trainer.train = train

    def remove(self) -> None:
        if self._original is not None:
            transformers.Trainer.train = self._original
            self._original = None
