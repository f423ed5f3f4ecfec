"""Rank 0's MLflow rows, handed to the head node: an ormas-monitor sink that never waits.

The fit's MLflow writer lives in the run ledger on the head node (head/mlflow_writer.py), the
only process that talks to MLflow. Rank 0's monitor calls this sink at each check; it submits an
actor call (`track_rows`, and `track_attempt` once per attempt) and returns. Workers never import
mlflow, never reach the tracking server and never hold its credentials.

Hooks relied on: ormas-monitor's sink protocol `sink(kind, payload)`; the ledger's actor calls.
"""

from __future__ import annotations

from typing import Any

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.segments import event_step

logger = get_logger("ray_ormas.mlflow")


class RowForwarder:
    """Rank 0's ormas-monitor sink: hands each row and event to the head-node writer (through the
    ledger) and returns: an actor call submitted, never awaited. Workers never import mlflow or
    reach the server."""

    def __init__(self, ledger: Any, prefix: str, attempt: int, step_offset: int, primary: bool) -> None:
        self._ledger = ledger
        self._prefix = prefix
        self._offset = step_offset
        self._last_step = 0
        self._failed = False
        if primary:
            self._submit(ledger.track_attempt, attempt, step_offset)

    def __call__(self, kind: str, payload: dict) -> None:
        if kind == "metrics":
            body = {k: payload.get(k) for k in ("step", "loss", "grad", "stuck")}
        else:
            self._last_step = event_step(payload, self._last_step)
            body = {"event": payload.get("event"), "step": self._last_step}
        self._submit(self._ledger.track_rows, self._prefix, self._offset, kind, body)

    def _submit(self, method: Any, *args: Any) -> None:
        if self._failed:
            return
        try:
            method.remote(*args)
        except Exception as e:  # telemetry never breaks training; the record has it all
            self._failed = True
            logger.warning(
                "could not hand MLflow rows to the head node (%s: %s); the record keeps "
                "them and the fit's end sends them from there",
                type(e).__name__,
                e,
            )

    def __repr__(self) -> str:
        return f"ray-ormas RowForwarder({self._prefix})"
