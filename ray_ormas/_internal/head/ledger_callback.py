"""The controller side of the run ledger: a Ray Train `UserCallback` that forwards reports.

It runs in Ray Train's controller. Its `after_report` hook receives one metrics dict per rank
(index = world rank) for every report; it forwards those that carry ray-ormas facts to the
ledger (the fleet view), and, when the fit is tracked, rank 0's metrics and checkpoint of each
`ray_ormas.report` to the ledger's MLflow writer. `after_exception` tells both that an attempt
failed. It never waits on the ledger.

Kept apart from head/ledger.py so that the ledger actor's process does not import Ray Train (about
1 s of CPU on the head node while the workers start).

Hooks relied on: `ray.train.UserCallback.after_report` / `after_exception`.
"""

from __future__ import annotations

from typing import Any, Mapping

from ray.train import Checkpoint, UserCallback

from ray_ormas._internal.common import keys


class LedgerCallback(UserCallback):
    """Forwards every report that carries ray-ormas facts to the ledger, and, when the fit is
    tracked, rank 0's metrics and checkpoint of each `ray_ormas.report` and the end of a failed
    attempt to the ledger's MLflow writer (head/mlflow_writer.py). Never waits."""

    def __init__(self, ledger: Any, tracked: bool = False) -> None:
        self._ledger = ledger
        self._tracked = tracked

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        self.forward_report(metrics, checkpoint)

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.forward_exception(worker_exceptions)

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
