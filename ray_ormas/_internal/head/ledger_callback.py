"""The controller side of the run ledger: a Ray Train `UserCallback` that forwards reports.

It runs in Ray Train's controller. Its `after_report` hook receives one metrics dict per rank
(index = world rank) for every report; it forwards those that carry ray-ormas facts to the
ledger (the fleet view), and, when the fit is tracked, rank 0's metrics and checkpoint of each
`ray_ormas.report` to the ledger's MLflow writer. `after_exception` tells both that an attempt
failed. It never waits on the ledger, but for one case: when an alarm can act
(`FleetSettings.actions`), `after_exception` waits (at most STOP_WAIT_S) for the ledger's answer,
and raises `FleetStopError` when an alarm's action was `stop`: an error in a controller callback
ends the fit as a `ControllerError`, which Ray's failure policy does not retry.

Kept apart from head/ledger.py so that the ledger actor's process does not import Ray Train (about
1 s of CPU on the head node while the workers start).

Hooks relied on: `ray.train.UserCallback.after_report` / `after_exception`, and Ray Train's
controller turning an exception of a callback into a `ControllerError` (not retried).
"""

from __future__ import annotations

from typing import Any, Mapping

import ray
from ray.train import Checkpoint, UserCallback

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.logs import get_logger
from ray_ormas.errors import FleetStopError

logger = get_logger("ray_ormas.fleet")
STOP_WAIT_S = 10.0


class LedgerCallback(UserCallback):
    """Forwards every report that carries ray-ormas facts to the ledger, and, when the fit is
    tracked, rank 0's metrics and checkpoint of each `ray_ormas.report` and the end of a failed
    attempt to the ledger's MLflow writer (head/mlflow_writer.py). Never waits, but after a
    failed attempt of a fit whose alarms can act (see the module docstring)."""

    def __init__(self, ledger: Any, tracked: bool = False, acts: bool = False) -> None:
        self._ledger = ledger
        self._tracked = tracked
        self._acts = acts  # an alarm can act: checkpoints are told, a stop is raised here

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        self.forward_report(metrics, checkpoint)

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        refs = self.forward_exception(worker_exceptions)
        if not self._acts:
            return
        try:
            stop = ray.get(refs[0], timeout=STOP_WAIT_S)
        except Exception as e:  # the ledger is gone or slow: Ray's failure policy decides alone
            logger.warning("fleet: could not ask the ledger whether to stop (%s: %s)", type(e).__name__, e)
            return
        if stop:
            raise FleetStopError(stop)

    def forward_report(self, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> list[Any]:
        """What `after_report` sends; returns the calls' refs (Ray Train's local mode waits on them,
        since the run ledger is an async actor and would not keep them in order with the driver's
        own calls)."""
        refs = []
        if metrics and all(isinstance(m, dict) and keys.RANK in m for m in metrics):
            refs.append(
                self._ledger.add_report.remote([{k: v for k, v in m.items() if keys.is_ormas(k)} for m in metrics])
            )
            rank0 = metrics[0]
            if self._acts and checkpoint is not None:
                refs.append(self._ledger.checkpoint_taken.remote(rank0.get(keys.RUN_STEP), checkpoint))
            if self._tracked and rank0.get(keys.KIND) == "user":
                refs.append(
                    self._ledger.track_report.remote(
                        {k: v for k, v in rank0.items() if not keys.is_ormas(k)},
                        rank0.get(keys.RUN_STEP),
                        checkpoint,
                    )
                )
        return refs

    def forward_exception(self, worker_exceptions: Mapping[int, BaseException]) -> list[Any]:
        """What `after_exception` sends; returns the calls' refs."""
        refs = [
            self._ledger.add_exception.remote({r: f"{type(e).__name__}: {e}" for r, e in worker_exceptions.items()})
        ]
        if self._tracked:
            refs.append(self._ledger.track_attempt_end.remote())
        return refs
