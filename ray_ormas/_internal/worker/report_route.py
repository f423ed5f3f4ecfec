"""The loop's own `ray.train.report(...)` calls, routed through ray-ormas while its session runs.

A loop written for `TorchTrainer` reports with `ray.train.report` (so do Ray's Lightning and
Transformers `RayTrainReportCallback`s). Under `RayOrmasTrainer` those calls must do what
`ray_ormas.report` does: meet the other ranks at the ledger, bring the record in storage up to a
reported checkpoint and put the record pointer in its metadata, and add the `ormas/...` facts.

Hook relied on: Ray Train V2's `TrainFnUtils`, the object every public `ray.train` call of a
worker goes through (`ray.train.v2._internal.execution.train_fn_utils.get_train_fn_utils` /
`set_train_fn_utils`). Ray's docstring invites it: "This class can be patched if new user APIs
behaviors is wanted". It is private, so seams/ray_train.py's `report_seam` compares it with Ray 2.60's
(`report`'s parameters) and names what changed; a changed seam leaves reports unrouted, loudly,
and never stops training. ray-ormas's own reports pass straight through (`passing_through`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.seams.ray_train import report_seam
from ray_ormas.errors import RaySeamChanged

logger = get_logger("ray_ormas.report_route")

Route = Callable[[dict[str, Any], Any, dict[str, Any]], None]  # (metrics, checkpoint, other keyword arguments)


class _RoutedTrainFnUtils:
    """Ray's TrainFnUtils with `report` routed to ray-ormas; everything else is Ray's own."""

    def __init__(self, inner: Any, route: Route, local: threading.local) -> None:
        self._inner = inner
        self._route = route
        self._local = local

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        if getattr(self._local, "passing", False):
            self._inner.report(metrics=metrics, checkpoint=checkpoint, **kwargs)
        else:
            self._route(metrics, checkpoint, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ReportRoute:
    """Routes `ray.train.report` to `route` between `install()` and `remove()` in this process."""

    def __init__(self, route: Route) -> None:
        self._route = route
        self._local = threading.local()
        self._module: Any = None
        self._inner: Any = None

    def install(self) -> bool:
        """Route reports; False (with one error line) if Ray's seam changed."""
        try:
            module = report_seam()
        except RaySeamChanged as e:
            logger.error(
                "the loop's own ray.train.report calls cannot carry the record on this Ray "
                "version (%s): its checkpoints get no record pointer and its reports no ormas/ facts. "
                "Training goes on; call ray_ormas.report(...) instead, or install the Ray version CI "
                "tests (ray==2.60.0)",
                e,
            )
            return False
        self._module, self._inner = module, module.get_train_fn_utils()
        module.set_train_fn_utils(_RoutedTrainFnUtils(self._inner, self._route, self._local))
        return True

    def remove(self) -> None:
        if self._module is not None:
            self._module.set_train_fn_utils(self._inner)
            self._module = self._inner = None

    @contextmanager
    def passing_through(self) -> Iterator[None]:
        """ray-ormas's own `ray.train.report` calls inside go to Ray unchanged."""
        self._local.passing = True
        try:
            yield
        finally:
            self._local.passing = False
