"""Ray Tune sweeps of RayOrmasTrainer fits, as Ray Tune runs Ray Train V2 trainers: a function
trainable builds the trainer with `TuneReportCallback` in its RunConfig and calls fit().

Each trial is its own fit: its own record (in its run folder), its own MLflow run with the trial's
config as params, and the monitor's facts reach Tune with every report, so a scheduler can stop a
trial whose layers died. The sweep: a healthy trial (2 workers, with fleet actions configured,
none of which fires), then one whose conv2 and conv3 are dead
(lesioned, no repair), which ASHA on `ormas/stuck_layers` stops at its first report, then a
healthy one that a stopper stops at its loop's last report (a fast trial: the stop arrives
after its loop ended).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ray import tune
from ray.train import RunConfig, ScalingConfig
from ray.tune import Stopper
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler

from ray_ormas import FleetSettings, RayOrmasTrainer, open_records

from .loops import resume_loop

STORAGE: dict[str, str] = {}  # the test's storage, for the trainable (it runs in the trial's actor)


EPOCHS = 4  # one report each, then ray-ormas's final one


def trainable(config: dict) -> None:
    """One trial: a RayOrmasTrainer fit named after the trial, reporting to Tune. The healthy
    trial runs on 2 workers with fleet actions configured (none fires); the others on 1."""
    healthy = config["trial"] == "healthy"
    RayOrmasTrainer(
        resume_loop,
        train_loop_config={"epochs": EPOCHS, "lesion": config["trial"] == "dead"},
        check_every=3,
        verbose=False,
        fleet=FleetSettings(actions={"nonfinite": "stop", "hang": "diagnose"}) if healthy else True,
        scaling_config=ScalingConfig(num_workers=2 if healthy else 1),
        run_config=RunConfig(
            name=f"trial-{tune.get_context().get_trial_id()}",
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
        ),
    ).fit()


class StopTheFastTrialAtItsLastReport(Stopper):
    """Stops the "fast" trial at its loop's last report: Tune's stop arrives after its loop ended."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return result["config"]["trial"] == "fast" and result["training_iteration"] >= EPOCHS

    def stop_all(self) -> bool:
        return False


def ray_ormas_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("ray-ormas")), *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(900)
def test_a_sweep_gives_each_trial_its_record_and_mlflow_run_and_asha_stops_the_trial_whose_layers_died(storage):
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search(["healthy", "dead", "fast"]), "storage": str(storage)},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=1,  # in order: the healthy trial sets the bar at the first rung
            scheduler=ASHAScheduler(metric="ormas/stuck_layers", mode="min", grace_period=1, max_t=100),
        ),
        run_config=tune.RunConfig(name="sweep", storage_path=str(storage), stop=StopTheFastTrialAtItsLastReport()),
    )
    results = tuner.fit()
    by_trial = {r.config["trial"]: r for r in results}
    healthy, dead, fast = by_trial["healthy"], by_trial["dead"], by_trial["fast"]
    assert healthy.error is None and dead.error is None and fast.error is None
    # The monitor's facts reached Tune with every report; ASHA stopped the dead trial at its first.
    # The healthy trial: its 4 epochs' reports, then ray-ormas's final one (the whole run's counts).
    assert healthy.metrics["training_iteration"] == 5 and healthy.metrics["ormas/kind"] == "final"
    assert healthy.metrics["ormas/stuck_layers"] == 0 and healthy.metrics["ormas/certificates"] == 0
    assert dead.metrics["training_iteration"] == 1 and dead.metrics["ormas/stuck_layers"] == 2

    runs = {name: storage / f"trial-{r.metrics['trial_id']}" for name, r in by_trial.items()}
    # One record per trial, in the trial's run folder. The healthy trial's fit ended as fits do.
    (done,) = open_records(runs["healthy"]).segments()
    assert done.complete and done.loop_ended and (runs["healthy"] / "ormas" / "run.html").is_file()
    # Its fleet (2 ranks, actions configured): every check of both ranks, and no action.
    fleet = open_records(runs["healthy"])
    assert set(fleet.fleet_checks().column("rank").to_pylist()) == {0, 1} and fleet.fleet_actions().num_rows == 0
    client = MlflowClient(f"sqlite:///{runs['healthy'] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["train_loop_config.lesion"] == "False"
    assert run.data.metrics["ormas/stuck_channels_total"] == 0 and "ray_ormas.closed_by" not in run.data.tags

    # The stopped trial: Tune ends the trial's actor where it is, so its fit never reaches its end
    # (the journal has no status). Whether rank 0 closes its monitor while the stop tears the fit
    # down (run_end carries the error) or is gone first (no run_end) is a race; either way the record
    # holds every check up to the stop. `ray-ormas mlflow-sync --close-as KILLED` makes its MLflow
    # run from the record and the journal, with the trial's config as params, and closes it.
    (stopped,) = open_records(runs["dead"]).segments()
    assert open_records(runs["dead"]).metrics().num_rows >= 2 and stopped.events >= 2
    assert not stopped.loop_ended
    synced = ray_ormas_cli("mlflow-sync", str(runs["dead"]), "--close-as", "KILLED")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    client = MlflowClient(f"sqlite:///{runs['dead'] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.data.params["train_loop_config.lesion"] == "True" and run.info.status == "KILLED"
    assert "never reached its end" in run.data.tags["ray_ormas.error"]
    assert run.data.tags["ray_ormas.closed_by"] == "ray-ormas mlflow-sync --close-as KILLED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "ormas/stuck_channels_total")][-1] > 0

    # The fast trial: Tune stopped it at its loop's last report, so the stop arrived after its loop
    # ended. Its record ends as the loop ended (a run_end without an error, whether or not the ledger
    # was gone when rank 0 closed). Its driver may have been stopped while the fit wound down, before
    # run.html and the MLflow run's status: `ray-ormas mlflow-sync` (no option) closes it as FINISHED
    # and writes the page; a fit whose driver got to its end is left as it is.
    assert fast.metrics["training_iteration"] == EPOCHS
    (ended,) = open_records(runs["fast"]).segments()
    assert ended.complete and ended.error is None and ended.loop_ended, ended
    synced = ray_ormas_cli("mlflow-sync", str(runs["fast"]))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert (runs["fast"] / "ormas" / "run.html").is_file()
    client = MlflowClient(f"sqlite:///{runs['fast'] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["ray_ormas.status"] == "FINISHED"
    assert "ray_ormas.error" not in run.data.tags
    closed_by = run.data.tags.get("ray_ormas.closed_by")
    assert closed_by is None or closed_by.startswith("ray-ormas mlflow-sync: the loop ended"), closed_by
    assert ("closed as FINISHED" in synced.stdout) == (closed_by is not None), synced.stdout
    print(f"the fast trial's fit {'was closed by mlflow-sync' if closed_by else 'reached its own end'}")
    assert [m.value for m in client.get_metric_history(run.info.run_id, "ormas/stuck_channels_total")][-1] == 0
