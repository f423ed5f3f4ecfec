"""How a fit ends, on the driver: one function for success and failure alike, in one order.

    wind_down(ledger, store, mlflow, ending)
      1. the ledger's snapshot: the reports, the workers' errors, the records, the staged segments
      2. the staged segments rank 0 could not upload, uploaded from their nodes (record/staging.py)
      3. after a failure: where each monitor's record is (one warning each); an NCCL hang becomes
         a fleet alarm
      4. the fleet record's end and its summary (head/fleet_head.py); the fit's goodput account
         (head/goodput_keeper.py), its timeline written, so that the page and MLflow show it
      5. the run's page, run.html (driver/run_page.py), before the MLflow run closes, so that the
         writer's last sync uploads it
      6. the MLflow run's end: FINISHED, FAILED or KILLED (head/mlflow_writer.py)

Every step after the first is telemetry: it says what went wrong and goes on, so a failed fit's
own error always propagates unchanged. A successful fit needs its snapshot for the result, so
there a snapshot that cannot be read is raised. The trainer kills the ledger afterwards.

Hooks relied on: the run ledger's methods (head/ledger.py), called with `ray.get` and a timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import ray

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.mlflow_settings import MLflowSettings
from ray_ormas._internal.driver.failures import every_wrapped, fleet_stop
from ray_ormas._internal.driver.run_page import write_run_page
from ray_ormas._internal.head.fleet_head import HANG_ERROR
from ray_ormas._internal.head.ledger import LedgerSnapshot
from ray_ormas._internal.head.mlflow_writer import TrackingOutcome
from ray_ormas._internal.record.fleet_record import FleetSummary
from ray_ormas._internal.record.goodput import GoodputAccount
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.staging import sweep
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.values import shown

logger = get_logger("ray_ormas.trainer")

FINISH_TIMEOUT_S = 300  # the writer's last sync and uploads, plus a few requests' timeouts
Status = Literal["FINISHED", "FAILED", "KILLED"]


@dataclass(frozen=True)
class Ending:
    """How the fit ended: its status, the error (on failure), the final checkpoint (on success)."""

    status: Status
    error: BaseException | None = None
    checkpoint: str | None = None

    @property
    def failed(self) -> bool:
        return self.status != "FINISHED"


@dataclass(frozen=True)
class WoundDown:
    """What the fit's end produced, for the result (`OrmasRun`)."""

    snapshot: LedgerSnapshot  # empty after a failure whose ledger could not be read
    not_uploaded: list[str]  # staged segments that stay on their nodes, one message each
    fleet: FleetSummary | None
    run_page: str | None
    tracking: TrackingOutcome | None
    goodput: GoodputAccount | None = None


def wind_down(ledger: Any, store: RecordStore, mlflow: MLflowSettings | None, ending: Ending) -> WoundDown:
    """End the fit (see the module docstring)."""
    snapshot = _snapshot(ledger, ending)
    not_uploaded = _sweep(store, snapshot, ending)
    if ending.failed:
        _tell_where_the_records_are(snapshot, store)
        hang = hang_error(ending.error) if ending.error is not None else None
        if hang is not None:
            ledger.fleet_error.remote(hang)
    fleet = _finish_fleet(ledger, ending.error is not None and fleet_stop(ending.error) is not None)
    goodput = close_goodput(ledger, ending.status)
    run_page = _write_run_page(store)
    tracking = _finish_tracking(ledger, store, mlflow, ending)
    return WoundDown(snapshot, not_uploaded, fleet, run_page, tracking, goodput)


def close_goodput(ledger: Any, status: Status) -> GoodputAccount | None:
    """The fit's goodput account up to now, its timeline written (called again as `fit()` returns,
    so that the record's account runs to the return); None when the ledger cannot say."""
    try:
        return ray.get(ledger.finish_goodput.remote(time.time(), status), timeout=10 if status == "KILLED" else 60)
    except Exception as e:  # telemetry: the fit's own outcome stands
        logger.warning("could not close the fit's goodput account (%s: %s)", type(e).__name__, e)
        return None


def hang_error(error: BaseException) -> str | None:
    """'NCCLHangError: ...' when Ray's NCCL hang detector ended the fit, else None."""
    hang = next((e for e in every_wrapped(error) if type(e).__name__ == HANG_ERROR), None)
    return None if hang is None else f"{type(hang).__name__}: {hang}"[:2000]


def _snapshot(ledger: Any, ending: Ending) -> LedgerSnapshot:
    if not ending.failed:
        return ray.get(ledger.snapshot.remote(), timeout=60)
    try:
        return ray.get(ledger.snapshot.remote(), timeout=10)
    except Exception as e:  # only hints on the way out: the training error propagates as it is
        logger.warning("could not read the run ledger after the failure (%s: %s)", type(e).__name__, e)
        return LedgerSnapshot(reports=[], exceptions=[], records={}, staged=[])


def _sweep(store: RecordStore, snapshot: LedgerSnapshot, ending: Ending) -> list[str]:
    """Upload what rank 0 staged but could not upload (record/staging.py). Not after Ctrl-C: the
    user asked to stop now."""
    if ending.status == "KILLED":
        return []
    try:
        return sweep(store, snapshot.staged, timeout_s=60) if ending.failed else sweep(store, snapshot.staged)
    except Exception as e:
        if not ending.failed:
            raise
        logger.warning("could not check rank 0's staged record (%s: %s)", type(e).__name__, e)
        return []


def _tell_where_the_records_are(snapshot: LedgerSnapshot, store: RecordStore) -> None:
    for name, path in snapshot.records.items():
        logger.warning(
            "training failed; the record of monitor %r is at %s (as of its last checkpoint, or "
            "complete with the error in its run_end if rank 0 could close it)",
            name,
            store.shown(path),
        )


def _finish_fleet(ledger: Any, stopped: bool) -> FleetSummary | None:
    try:
        return ray.get(ledger.finish_fleet.remote(stopped), timeout=FINISH_TIMEOUT_S)
    except Exception as e:  # the record stays as written; training is not affected
        logger.warning("could not finish the fleet record (%s: %s)", type(e).__name__, e)
        return None


def _write_run_page(store: RecordStore) -> str | None:
    """The run on one page, in the record (driver/run_page.py); never in the way of the fit."""
    try:
        return write_run_page(RunRecords(store))
    except Exception as e:
        logger.warning(
            "could not write the run's page (run.html) in %s (%s: %s); `ray-ormas report %s` writes it again",
            store.shown(),
            type(e).__name__,
            e,
            store.shown(),
        )
        return None


def _finish_tracking(
    ledger: Any, store: RecordStore, mlflow: MLflowSettings | None, ending: Ending
) -> TrackingOutcome | None:
    """Close the MLflow run with the fit's status; say once if MLflow could not take it all."""
    if mlflow is None:
        return None
    error = ending.error
    text = f"{type(error).__name__}: {error}" if error is not None else None
    try:
        outcome = ray.get(
            ledger.finish_tracking.remote(ending.status, text, ending.checkpoint),
            timeout=FINISH_TIMEOUT_S + 30 * mlflow.request_timeout_s,
        )
    except Exception as e:  # the ledger is gone or too slow: the journal and record remain
        outcome = TrackingOutcome(None, None, complete=False, error=f"{type(e).__name__}: {e}"[:300])
    if outcome is not None and not outcome.complete:
        logger.warning(
            "the MLflow run %s is incomplete: %s could not take the rest (%s). Training "
            "and the record are unaffected; `ray-ormas mlflow-sync %s` brings the run up to date "
            "from the record when the tracker is back",
            outcome.run_id or "(not created yet)",
            shown(outcome.tracking_uri or mlflow.tracking_uri or "MLflow"),
            outcome.error,
            store.shown(),
        )
    return outcome
