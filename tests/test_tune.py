"""Ray Tune sweeps of RayOrmasTrainer fits, as Ray Tune runs Ray Train V2 trainers: a function
trainable builds the trainer with `TuneReportCallback` in its RunConfig and calls fit().

Each trial is its own fit: its own record (in its run folder), its own MLflow run with the trial's
config as params, and the monitor's facts reach Tune with every report, so a scheduler can stop a
trial whose layers died. The sweep:

    healthy   2 workers, healthy layers, fleet actions configured. Rank 1 changes its weights
              outside DDP once, after global step 29: the `divergence` alarm at the loop's last
              check (run step 30) takes its stacks and restarts the trial's worker group
              (`["diagnose", "reattempt"]`) once the loop has ended, from the checkpoint the
              replicas last agreed on (run step 24), inside the trial; the trial runs to its end.
    dead      conv2 and conv3 dead (lesioned, no repair): ASHA on `ormas/stuck_layers` stops it
              at its first report.
    fast      healthy, 1 worker: a stopper stops it at its loop's last report (the stop arrives
              after its loop ended).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from ray import tune
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.tune import Stopper
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler

from ray_ormas import FleetSettings, RayOrmasTrainer, open_records

from .loops import resume_loop

STORAGE: dict[str, str] = {}  # the test's storage, for the trainable (it runs in the trial's actor)


EPOCHS = 4  # one report each, then ray-ormas's final one
NUDGE_AT = 28  # the healthy trial's rank 1 nudges its weights after update 29 (an epoch is 8 updates)
TRIAL_ACTIONS = {"divergence": ["diagnose", "reattempt"], "nonfinite": "stop", "hang": "diagnose"}


def trainable(config: dict) -> None:
    """One trial: a RayOrmasTrainer fit named after the trial, reporting to Tune. The healthy
    trial runs on 2 workers with fleet actions configured, and rank 1 diverges once; the others
    run on 1."""
    healthy = config["trial"] == "healthy"
    name = f"trial-{tune.get_context().get_trial_id()}"
    loop_config = {"epochs": EPOCHS, "lesion": config["trial"] == "dead"}
    if healthy:  # once per fit (a marker in once_dir), whichever attempt reaches the step
        once = Path(config["storage"]) / f"{name}-once"
        once.mkdir(exist_ok=True)
        loop_config.update(nudge_rank=1, nudge_at=NUDGE_AT, once_dir=str(once))
    RayOrmasTrainer(
        resume_loop,
        train_loop_config=loop_config,
        check_every=3,
        verbose=False,
        fleet=FleetSettings(actions=TRIAL_ACTIONS) if healthy else True,
        scaling_config=ScalingConfig(num_workers=2 if healthy else 1),
        run_config=RunConfig(
            name=name,
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
            failure_config=FailureConfig(max_failures=1),  # a reattempt is a failure to Ray
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
    # The healthy trial: its 4 epochs' reports, epoch 3's again after the restart, then
    # ray-ormas's final one (the whole run's counts).
    assert healthy.metrics["training_iteration"] == 6 and healthy.metrics["ormas/kind"] == "final"
    assert healthy.metrics["ormas/stuck_layers"] == 0 and healthy.metrics["ormas/certificates"] == 0
    assert dead.metrics["training_iteration"] == 1 and dead.metrics["ormas/stuck_layers"] == 2

    runs = {name: storage / f"trial-{r.metrics['trial_id']}" for name, r in by_trial.items()}
    # One record per trial, in the trial's run folder. The healthy trial's fleet acted inside the
    # trial: rank 1's replica diverged at the loop's last check; once the loop had ended, every
    # rank raised the order there, and the group restarted from the checkpoint at run step 24
    # (epoch 2's, the last taken while the replicas agreed; epoch 3's came after the damage).
    fleet = open_records(runs["healthy"])
    [divergence] = [a for a in fleet.fleet_alarms().to_pylist() if a["kind"] == "divergence"]
    assert (divergence["attempt"], divergence["ranks"], divergence["run_step"]) == (0, [1], 30), divergence
    [acted] = [json.loads(line) for line in fleet.fleet_actions().column("line").to_pylist()]
    assert (acted["action"], acted["outcome"], acted["checkpoint_run_step"]) == ("reattempt", "done", 24), acted
    assert acted["resumed_run_step"] == 24
    stack = acted["stacks"]["1"]  # rank 1's worker, read by py-spy (kept alive until the order came)
    assert "ray::RayTrainWorker" in stack and "could not read" not in stack, stack
    first, resumed = fleet.segments()
    assert "FleetReattemptError" in str(first.error) and resumed.step_offset == 24
    assert resumed.complete and resumed.loop_ended
    assert (runs["healthy"] / "ormas" / "run.html").is_file()
    later: dict = {}  # the restarted replicas agree at every check again (one digest per check)
    for c in fleet.fleet_checks().to_pylist():
        if c["attempt"] == 1:
            later.setdefault(c["check"], set()).add((c["rank"], c["digest"]))
    assert later and all({r for r, _ in d} == {0, 1} and len({g for _, g in d}) == 1 for d in later.values())
    client = MlflowClient(f"sqlite:///{runs['healthy'] / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["train_loop_config.lesion"] == "False"
    assert run.data.metrics["ormas/stuck_channels_total"] == 0 and "ray_ormas.closed_by" not in run.data.tags
    [logged] = client.get_metric_history(run.info.run_id, "fleet/actions/divergence")
    assert logged.step == divergence["run_step"]

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
