"""The function each Ray Train worker runs: the user's loop inside a ray-ormas session.

Built on the driver (driver/trainer.py) and pickled by Ray; on the worker it opens the session
(session.py), keeps Ray Train's per-report log line out of the console unless asked for
(seams/ray_train.py), screens the worker group before its first step (worker/preflight.py:
the probes, and the order the screen's alarm gave, raised here), turns on zero-change adoption
for the length of the loop (worker/adoption.py), closes every
monitor when the loop returns or raises, and re-raises the loop's own exception unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ray_ormas._internal.seams.ray_train import hide_report_lines
from ray_ormas._internal.worker.adoption import Adoption
from ray_ormas._internal.worker.plan import WorkerPlan
from ray_ormas._internal.worker.preflight import screen
from ray_ormas._internal.worker.session import WorkerSession, activate


def _accepts_config(fn: Callable[..., Any]) -> bool:
    return bool(inspect.signature(fn).parameters)


def wrap_train_loop(user_fn: Callable[..., Any], plan: WorkerPlan) -> Callable[[dict], Any]:
    """The function TorchTrainer runs on each worker: the user's loop inside a ray-ormas session."""
    takes_config = _accepts_config(user_fn)

    def train_fn(config: dict) -> Any:
        if not plan.settings.ray_report_lines:
            hide_report_lines()  # Ray Train's per-report line with the whole metrics dict, on every rank
        session = WorkerSession(plan)
        if plan.preflight is not None:  # before any step: an evict or a stop it orders is raised here
            screen(plan.ledger, session.token, session.rank, session.world_size, plan.preflight, plan.fleet_acts)
        activate(session)
        adoption = Adoption(session)
        try:
            adoption.install()
            try:
                value = user_fn(config) if takes_config else user_fn()
            except BaseException:
                session.abort()
                raise
            session.finish()
            return value
        finally:
            adoption.remove()
            activate(None)

    # Not functools.wraps: Ray reads the signature (and __wrapped__) to decide whether to pass config.
    train_fn.__name__ = train_fn.__qualname__ = getattr(user_fn, "__name__", "train_loop")
    return train_fn
