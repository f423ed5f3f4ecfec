"""What `RayOrmasTrainer.fit()` returns, on the driver: Ray's `Result` with `.ormas`, an `OrmasRun`.

`OrmasRun` is read-only data the trainer fills from the run ledger's last snapshot and the
record (driver/trainer.py `_ormas_run`): the record's locations, the whole run's facts, the fleet
view, MLflow's run. Its two methods read what it holds (`digests`) or the record (`open_records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.train import Result

from ray_ormas._internal.common import keys
from ray_ormas._internal.record.fleet_record import FleetSummary
from ray_ormas._internal.record.goodput import GoodputAccount
from ray_ormas._internal.record.reader import RunRecords
from ray_ormas._internal.record.store import RecordStore


@dataclass(frozen=True)
class OrmasRun:
    """What ray-ormas adds to Ray's Result.

    Attributes:
        store: where the records persist (a pyarrow filesystem and the `ormas` folder on it).
        records: each monitor's segment of this fit's last attempt, as a path in `store`.
        record_dir: the main monitor's segment as a local path, when the store is local (a
            disk or a mount); None on object storage (use `records`, or `open_records()`).
        report: the main monitor's engineer report (`report.html`), when the store is local and
            the report was written.
        final: rank 0's `ormas/...` facts from the last report, with the whole run's counts:
            `alarms`, `certificates`, `repairs`, `channels_repaired`, `loss_spikes`,
            `nonfinite`, `skipped_steps` and `checks` summed over every segment of the run (every
            attempt, and every earlier fit that this one continued), `segments` (how many), and
            the state at the end (`stuck_channels`, `stuck_layers`, `loss`) from the run's last
            segment with a check. docs/quickstart.md lists every key.
        segments: one row per segment of every monitor of the run: `monitor`, `segment`,
            `attempt`, `fit_id`, `step_offset`, `complete`, its own counts, and its state at its
            end (`stuck_channels_at_end`, `loss_at_end`): the per-attempt figures.
        reports: the fleet view: for every ray-ormas report, one dict of `ormas/...` facts per rank
            (index = world rank), exactly as `ray.train.report` delivered them to the controller.
        worker_errors: for each failed attempt, {rank: "Type: message"}.
        mlflow_run_id: the fit's MLflow run (None when tracking is off, or the tracker was down
            for the whole fit: `ray-ormas mlflow-sync` creates it later).
        tracking_uri: where that run is.
        mlflow_complete: the run holds everything the record holds (False after an outage that
            outlasted the fit; None when tracking is off).
        fleet: fleet health (a `FleetSummary`: per-rank table, alarms, the fleet record's path);
            None when it is off (`fleet=False`, or a single worker).
        not_uploaded: on object storage, one message per segment that storage could not take
            by the end of the fit, naming the node and folder that hold its local copy.
        goodput: where the fit's time went (a `GoodputAccount`: `goodput`, seconds per bucket,
            the restarts by cause, each attempt's own; docs/goodput.md). `open_records()` and
            `ray-ormas goodput RUN` give the whole run's, across continuations.
        run_page: the run on one page (`run.html` at the record's root: attempts, metrics,
            layers, fleet health, whole-run facts), as the store shows it; None when it could not
            be written (a warning says why). `ray-ormas report RUN` writes it again.
    """

    store: RecordStore
    records: dict[str, str]
    record_dir: Path | None
    report: Path | None
    final: dict[str, Any]
    segments: list[dict[str, Any]] = field(default_factory=list)
    reports: list[list[dict[str, Any]]] = field(default_factory=list)
    worker_errors: list[dict[int, str]] = field(default_factory=list)
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    mlflow_complete: bool | None = None
    fleet: FleetSummary | None = None
    not_uploaded: list[str] = field(default_factory=list)
    run_page: str | None = None
    goodput: GoodputAccount | None = None

    def digests(self, key: str = keys.PREFIX + keys.PARAM_DIGEST) -> list[list[str | None]]:
        """Per report, each rank's parameter digest: equal digests mean identical replicas."""
        return [[rank.get(key) for rank in per_rank] for per_rank in self.reports]

    def open_records(self) -> RunRecords:
        """Every segment of every monitor under this run's record root, readable as Arrow tables."""
        return RunRecords(self.store)


@dataclass
class RayOrmasResult(Result):
    """Ray's `Result`, unchanged, plus `ormas` (an `OrmasRun`)."""

    ormas: OrmasRun | None = None
