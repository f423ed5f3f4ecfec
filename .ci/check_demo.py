"""What a version set's short demo must have recorded (.ci/version_sets check): telemetry never
stops a fit, so `ray-ormas demo` exits 0 even when a dependency broke MLflow or the fleet; this
reads what the three fits left and fails on what is missing.

    python .ci/check_demo.py DEMO_OUT      # the demo's --out folder
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import mlflow

import ray_ormas

ARMS = ("healthy", "watch", "repair")
logger = logging.getLogger("ci.check_demo")


def check(out: Path) -> list[str]:
    """What is missing from the demo's record and its MLflow store (nothing: an empty list)."""
    missing = []
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ray-ormas-demo")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    by_name = {r.info.run_name: r for r in runs}
    for arm in ARMS:
        name = f"digits-{arm}"
        run = by_name.get(name)
        if run is None:
            missing.append(f"MLflow: no run {name} (runs: {sorted(by_name)})")
            continue
        if run.info.status != "FINISHED":
            missing.append(f"MLflow: {name} is {run.info.status}")
        for key in ("goodput/fit", "fleet/loss_mean", "ormas/channels_repaired"):
            if key not in run.data.metrics:
                missing.append(f"MLflow: {name} has no metric {key}")
        records = ray_ormas.open_records(out / name)
        if records.fleet_checks().num_rows == 0:
            missing.append(f"record: {name} has no fleet checks")
        if records.goodput() is None:
            missing.append(f"record: {name} has no goodput account")
        if not records.segments():
            missing.append(f"record: {name} has no monitor segment")
    repaired = by_name.get("digits-repair")
    if repaired is not None and not repaired.data.metrics.get("ormas/channels_repaired"):
        missing.append("the repair run repaired no channel")
    return missing


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(sys.argv) != 2:
        logger.error("usage: python .ci/check_demo.py DEMO_OUT")
        return 2
    missing = check(Path(sys.argv[1]).resolve())
    for line in missing:
        logger.error("missing: %s", line)
    if not missing:
        logger.info("the demo recorded everything: 3 runs in MLflow, fleet checks, goodput, segments")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
