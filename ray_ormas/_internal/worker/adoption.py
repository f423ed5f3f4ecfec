"""Zero-change adoption: what a RayOrmasTrainer loop turns on so that code written for Ray Train
gets the monitor without being changed.

* Every rank: the loop's own `ray.train.report` calls go through ray-ormas (worker/report_route.py).
* With `auto_monitor` on (the default):
  - a plain PyTorch loop gets a monitor on each model an optimizer steps (worker/auto_monitor.py);
  - a Lightning `Trainer` built in the loop gets ormas-monitor's Lightning callback through
    Lightning's `lightning.pytorch.callbacks_factory` entry point (`lightning_callbacks`, declared
    in pyproject.toml; worker/integrations/lightning.py);
  - a Transformers `Trainer` gets ormas-monitor's Transformers callback when `train()` runs
    (worker/integrations/transformers.py).
* On the driver, `check_frameworks` finds which of Lightning and Transformers the loop uses
  (the names its code and its module refer to) and fails before anything starts when the piece
  ray-ormas needs for it is missing, naming the extra to install.

This module is imported by Lightning in every process that builds a Trainer (the entry point), so
it imports nothing heavy at module level.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import sys
import types
from typing import Any, Callable

from ray_ormas._internal.common.logs import get_logger
from ray_ormas.errors import MissingExtraError, UsageError

logger = get_logger("ray_ormas.adoption")

LIGHTNING_ENTRY_POINT_GROUP = "lightning.pytorch.callbacks_factory"
ENTRY_POINT_NAME = "ray_ormas"
# framework -> (root modules that mean it, the ray-ormas module it needs, the extra that installs it)
FRAMEWORKS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "lightning": (
        ("lightning", "ray.train.lightning"),
        "ray_ormas._internal.worker.integrations.lightning",
        "lightning",
    ),
    "transformers": (
        ("transformers", "ray.train.huggingface"),
        "ray_ormas._internal.worker.integrations.transformers",
        "transformers",
    ),
}


def lightning_callbacks() -> list[Any]:
    """Lightning's callback factory (entry point): ray-ormas's callback inside a RayOrmasTrainer
    loop with `auto_monitor` on; nothing anywhere else."""
    worker = sys.modules.get("ray_ormas._internal.worker.session")
    session = worker.current_session() if worker is not None else None
    if session is None or not session.plan.settings.auto_monitor:
        return []
    from ray_ormas._internal.worker.integrations.lightning import RayOrmasLightningCallback

    return [RayOrmasLightningCallback(automatic=True)]


class Adoption:
    """Installed for the length of one session's loop in its worker process; `remove()` undoes it."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._pieces: list[Any] = []

    def install(self) -> None:
        from ray_ormas._internal.worker.report_route import ReportRoute

        session = self._session
        route = ReportRoute(session.route_report)
        if route.install():
            session.report_route = route
            self._pieces.append(route)
        if not session.plan.settings.auto_monitor:
            return
        from ray_ormas._internal.worker.auto_monitor import AutoMonitors

        auto = AutoMonitors(session)
        auto.install()
        self._pieces.append(auto)
        if "transformers" in session.plan.frameworks or "transformers.trainer" in sys.modules:
            self._hook_transformers()

    def _hook_transformers(self) -> None:
        try:
            from ray_ormas._internal.worker.integrations.transformers import TrainerHook

            hook = TrainerHook()
            hook.install()
        except (ImportError, RuntimeError) as e:  # the driver checked; a worker may still differ
            logger.error(
                "no monitor for Transformers trainers (%s); training goes on. "
                "pip install 'ray-ormas[transformers]' on every node",
                e,
                rank=self._session.rank,
            )
            return
        self._pieces.append(hook)

    def remove(self) -> None:
        for piece in reversed(self._pieces):
            try:
                piece.remove()
            except Exception as e:  # never over the loop's own outcome
                logger.warning("could not remove %s (%s: %s)", type(piece).__name__, type(e).__name__, e)
        self._pieces = []
        self._session.report_route = None


def frameworks_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The frameworks (FRAMEWORKS' keys) a training loop refers to: in its code (imports and names,
    nested functions included) and in what those names are in its module (modules, classes and
    functions, with their base classes), one call deep into functions of the same module."""
    roots = set(_referenced_modules(fn, depth=2))
    return tuple(
        name
        for name, (modules, _, _) in FRAMEWORKS.items()
        if any(root == m or root.startswith(m + ".") for root in roots for m in modules)
    )


def check_frameworks(fn: Callable[..., Any]) -> tuple[str, ...]:
    """On the driver: the frameworks the loop uses, each checked to be adoptable here; an
    ImportError naming the extra (or a RuntimeError naming the missing entry point) otherwise."""
    found = frameworks_of(fn)
    for name in found:
        _, module, extra = FRAMEWORKS[name]
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise MissingExtraError(
                f"the training loop uses {name}, and ray-ormas attaches ormas-monitor's {name} callback "
                f"to it, which needs the extra: pip install 'ray-ormas[{extra}]' on the driver and every "
                f"node ({e}). Or pass auto_monitor=False to train without it"
            ) from None
        if name == "lightning" and not _entry_point_registered():
            raise UsageError(
                f"the training loop uses Lightning, and ray-ormas reaches its Trainer through the "
                f"'{LIGHTNING_ENTRY_POINT_GROUP}' entry point, which is not registered: ray-ormas is "
                f"imported from a source tree that was not installed. pip install -e . (or "
                f"'ray-ormas[lightning]'), or pass auto_monitor=False"
            )
    return found


def _entry_point_registered() -> bool:
    return any(ep.name == ENTRY_POINT_NAME for ep in importlib.metadata.entry_points(group=LIGHTNING_ENTRY_POINT_GROUP))


def _referenced_modules(fn: Any, depth: int) -> list[str]:
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(const for const in c.co_consts if isinstance(const, types.CodeType))
    found = list(names)  # `import lightning` inside the loop names the module itself
    scope = getattr(fn, "__globals__", {})
    for name in names:
        value = scope.get(name)
        if isinstance(value, types.ModuleType):
            found.append(value.__name__)
        elif inspect.isclass(value):
            found += [getattr(base, "__module__", "") or "" for base in value.__mro__]
        elif callable(value):
            found.append(getattr(value, "__module__", "") or "")
            if depth > 1 and getattr(value, "__module__", None) == getattr(fn, "__module__", None):
                found += _referenced_modules(value, depth - 1)
    return found
