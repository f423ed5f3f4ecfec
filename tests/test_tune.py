"""Ray Tune sweeps of RayOrmasTrainer fits, as Ray Tune runs Ray Train V2 trainers: a function
trainable builds the trainer with `TuneReportCallback` in its RunConfig and calls fit().

Each trial is its own fit: its own record (in its run folder), its own MLflow run with the trial's
config as params, and the monitor's facts reach Tune with every report, so a scheduler can stop a
trial whose layers died. The sweep: a healthy trial, then one whose conv2 and conv3 are dead
(lesioned, no repair); ASHA on `ormas/stuck_layers` stops the second at its first report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ray import tune
from ray.train import RunConfig, ScalingConfig
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler

from ray_ormas import RayOrmasTrainer, open_records

from .loops import resume_loop

STORAGE: dict[str, str] = {}  # the test's storage, for the trainable (it runs in the trial's actor)


def trainable(config: dict) -> None:
    """One trial: a RayOrmasTrainer fit named after the trial, reporting to Tune."""
    RayOrmasTrainer(
        resume_loop,
        train_loop_config={"epochs": 4, "lesion": config["lesion"]},
        check_every=3,
        verbose=False,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name=f"trial-{tune.get_context().get_trial_id()}",
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
        ),
    ).fit()


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(600)
def test_a_sweep_gives_each_trial_its_record_and_mlflow_run_and_asha_stops_the_trial_whose_layers_died(storage):
    tuner = tune.Tuner(
        trainable,
        param_space={"lesion": tune.grid_search([False, True]), "storage": str(storage)},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=1,  # in order: the healthy trial sets the bar at the first rung
            scheduler=ASHAScheduler(metric="ormas/stuck_layers", mode="min", grace_period=1, max_t=100),
        ),
        run_config=tune.RunConfig(name="sweep", storage_path=str(storage)),
    )
    results = tuner.fit()
    by_lesion = {r.config["lesion"]: r for r in results}
    healthy, dead = by_lesion[False], by_lesion[True]
    assert healthy.error is None and dead.error is None
    # The monitor's facts reached Tune with every report; ASHA stopped the dead trial at its first.
    # The healthy trial: its 4 epochs' reports, then ray-ormas's final one (the whole run's counts).
    assert healthy.metrics["training_iteration"] == 5 and healthy.metrics["ormas/kind"] == "final"
    assert healthy.metrics["ormas/stuck_layers"] == 0 and healthy.metrics["ormas/certificates"] == 0
    assert dead.metrics["training_iteration"] == 1 and dead.metrics["ormas/stuck_layers"] == 2

    runs = {lesion: storage / f"trial-{r.metrics['trial_id']}" for lesion, r in by_lesion.items()}
    # One record per trial, in the trial's run folder. The healthy trial's fit ended as fits do.
    (done,) = open_records(runs[False]).segments()
    assert done.complete and (runs[False] / "ormas" / "run.html").is_file()
    client = MlflowClient(f"sqlite:///{runs[False] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["train_loop_config.lesion"] == "False"
    assert run.data.metrics["ormas/stuck_channels_total"] == 0

    # The stopped trial: Tune ends the trial's actor where it is, so its fit never reaches its end
    # (the journal has no status). Whether rank 0 closes its monitor while the stop tears the fit
    # down (run_end carries the error) or is gone first (no run_end) is a race; either way the record
    # holds every check up to the stop. `ray-ormas mlflow-sync --close-as KILLED` makes its MLflow
    # run from the record and the journal, with the trial's config as params, and closes it.
    (stopped,) = open_records(runs[True]).segments()
    assert open_records(runs[True]).metrics().num_rows >= 2 and stopped.events >= 2
    synced = subprocess.run(
        [str(Path(sys.executable).with_name("ray-ormas")), "mlflow-sync", str(runs[True]), "--close-as", "KILLED"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert synced.returncode == 0, synced.stdout + synced.stderr
    client = MlflowClient(f"sqlite:///{runs[True] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.data.params["train_loop_config.lesion"] == "True" and run.info.status == "KILLED"
    assert "never reached its end" in run.data.tags["ray_ormas.error"]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "ormas/stuck_channels_total")][-1] > 0
