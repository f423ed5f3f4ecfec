"""Elastic fits through a real resize, then the fleet's actions, on one simulated cluster:
`python -m tests.scenarios.elastic STORAGE OUT_DIR FIT[,FIT...]`.

`ray.cluster_utils.Cluster` starts a head node (the driver, Ray Train's controller, the run ledger)
and two worker nodes with one training slot each. Each fit asks for
`ScalingConfig(num_workers=(1, 2))` and a global batch of 64, and starts at 2 workers. Then
it loses a worker node (`SHRINK`), and Ray Train restarts the group at 1 worker from its latest
checkpoint:

    ddp    the fleet evicts it: the test's policy (tests/loops.py
           `evict_rank_1_then_reattempt_the_grown_attempt`) takes rank 1's stacks on its node, then
           drains that node (`evict_scope="cluster"`); with nowhere else to go, the group comes back smaller. Once the
           group has grown back, the same policy restarts it, and the restarted group's pre-flight
           screen stops the fit before its first step (`actions={"preflight": "stop"}`): the
           test's probe (tests/loops.py `StorageLostOnRank`) fails on rank 1 at its third screen
           (`FleetStopError`).
    fsdp   the node is removed (its raylet and every process on it die) once the fit's first
           checkpoint is registered. Once the group has grown back, the fit's policy
           (`reattempt_the_grown_attempt_once`) restarts it once, at the same size.

Once the 1-worker attempt has trained and checkpointed, a node is added again, and Ray Train
grows the group back to 2 (its elastic policy reads the cluster through Ray Data's autoscaling
coordinator, which looks every 20 s). The loop (tests/loops.py `elastic_loop`) stops two epochs
into the grown attempt (the FSDP fit returns there). The fits named ("ddp", "fsdp", and "acts":
the fleet's actions, tests/scenarios/acts.py) run one after the other on the same cluster, each
on the two worker nodes the previous one left; each writes its run to STORAGE/FIT and its
outcome to OUT_DIR/FIT.json for tests/test_elastic.py and tests/test_fleet_actions.py.
`Cluster.add_node` works only from the main thread, so an elastic `fit()` runs in a background
thread. The cluster is always shut down.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig, ScalingConfig

from ray_ormas import BatchSize, FleetSettings, FleetStopError, RayOrmasTrainer, open_records
from tests.loops import StorageLostOnRank, elastic_loop
from tests.scenarios import FAST_NODE_DEATH, alive, forget
from tests.scenarios.acts import acts_fit

WORKER_NODE = {"num_cpus": 1, "resources": {"train_slot": 1}}
DEADLINE_S = 600  # a fit's whole run: 171-281 s measured; bounds for a machine twice as slow
SHRINK = {"ddp": "evict", "fsdp": "remove"}  # how each strategy's fit loses a worker node
POLICY = {  # each strategy's fleet policy (tests/loops.py)
    "ddp": "tests.loops:evict_rank_1_then_reattempt_the_grown_attempt",
    "fsdp": "tests.loops:reattempt_the_grown_attempt_once",
}
# The DDP fit's pre-flight alarm stops it: its probe (in `resize_one_fit`) fails at rank 1's third
# screen (attempts 0, 2 and 3), once its grown group is restarted. Its factor is 10: beside the
# node-loss scenario on 2 cores, a rank's matmul may take twice its peer's at a start, which must
# not stop the fit.
SCREEN_STOP = {"preflight": "stop"}


def main(storage_root: str, out_dir: str, fits: str = "ddp") -> None:
    """Run `fits` (a comma-separated list of "ddp", "fsdp", "acts") one after the other."""
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    # After the node is gone, Ray may first try the old size again (the coordinator's view is
    # up to 20 s old): let that try give up in 10 s rather than the default 60 s.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "10"
    head = {"num_cpus": 1, "resources": {"trial_slot": 1}, "_system_config": FAST_NODE_DEATH}  # acts.py's trial
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        workers = [cluster.add_node(**WORKER_NODE), cluster.add_node(**WORKER_NODE)]
        ray.init(address=cluster.address, log_to_driver=False)
        previous_returned = True
        for fit in fits.split(","):
            storage = os.path.join(storage_root, fit)
            os.makedirs(storage, exist_ok=True)
            if not previous_returned:  # its fit still runs on the cluster
                outcome: dict[str, Any] = {"error": "scenario: not run, the previous fit did not return"}
            else:
                try:
                    if fit == "acts":
                        outcome = acts_fit(cluster, workers, WORKER_NODE, storage)
                    else:
                        outcome = resize_one_fit(cluster, workers, storage, fit)
                except BaseException as e:
                    outcome = {"error": f"scenario: {type(e).__name__}: {e}"}
                previous_returned = bool(outcome.get("finished"))
            (Path(out_dir) / f"{fit}.json").write_text(json.dumps(outcome, default=str))
    finally:
        ray.shutdown()
        cluster.shutdown()


def resize_one_fit(cluster: Cluster, workers: list[Any], storage: str, strategy: str) -> dict[str, Any]:
    """One elastic fit at 2 workers: a worker node evicted or removed (`SHRINK`), one added after
    the 1-worker attempt's first checkpoint (`workers` is kept up to date)."""
    shrink = SHRINK[strategy]
    timeline: list[tuple[str, float]] = []
    started = time.monotonic()

    def note(what: str) -> None:
        timeline.append((what, round(time.monotonic() - started, 1)))
        print(f"[elastic scenario, {strategy}] {what} at {timeline[-1][1]} s", flush=True)

    screens = os.path.join(storage, "screens")  # the DDP fit's probe counts its screens here
    os.makedirs(screens, exist_ok=True)
    trainer = RayOrmasTrainer(
        elastic_loop,
        train_loop_config={"epochs": 60, "sleep_per_step": 0.2, "grown_size": 2, "epochs_after_growth": 2},
        check_every=4,
        verbose=False,
        strategy=strategy,
        batch=BatchSize(64, per="global"),
        # Actions that nothing here fires, and the policy that acts (see the module docstring).
        # A drain for the whole cluster: Ray's elastic policy counts a node that is only kept out of
        # the run, would try the larger size there, and wait (docs/fleet-health.md).
        fleet=FleetSettings(
            actions={"divergence": "reattempt", "nonfinite": "stop", **(SCREEN_STOP if strategy == "ddp" else {})},
            policy=POLICY[strategy],
            evict_scope="cluster",
            preflight={"factor": 10, "probes": [StorageLostOnRank(rank=1, call=3, count_dir=screens)]}
            if strategy == "ddp"
            else True,
        ),
        scaling_config=ScalingConfig(
            num_workers=(1, 2),
            resources_per_worker={"CPU": 1, "train_slot": 1},
            elastic_resize_monitor_interval_s=2,
        ),
        run_config=RunConfig(name="elastic", storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            result = trainer.fit()
            fleet = result.ormas.fleet
            outcome.update(
                return_value=result.return_value,
                final=result.ormas.final,
                mlflow_run_id=result.ormas.mlflow_run_id,
                tracking_uri=result.ormas.tracking_uri,
                fleet_attempts=fleet.attempts if fleet else None,
                fleet_alarms=fleet.alarms if fleet else None,
                fleet_actions=fleet.actions if fleet else None,
                worker_errors=[{str(k): v for k, v in e.items()} for e in result.ormas.worker_errors],
            )
        except FleetStopError as e:  # the screen's stop (ddp): the test reads the record
            outcome["stopped"] = str(e)
        except BaseException as e:  # reported to the test, which fails on it
            outcome["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def sizes() -> list[int]:
        try:
            return [s.link.get("world_size") for s in open_records(os.path.join(storage, "elastic")).segments()]
        except Exception:  # the record root does not exist yet
            return []

    def registered() -> str:
        """Ray's checkpoint index, which its controller rewrites once it has registered a checkpoint
        ("" before the first): a checkpoint folder in storage alone may not be one Ray resumes from."""
        try:
            return (Path(storage) / "elastic" / "checkpoint_manager_snapshot.json").read_text()
        except OSError:
            return ""

    def wait(condition: Any, what: str) -> None:
        while not condition():
            if time.monotonic() - started > DEADLINE_S or not thread.is_alive():
                raise TimeoutError(f"gave up waiting for {what}; segments so far {sizes()}")
            time.sleep(0.2)
        note(what)

    try:
        if shrink == "remove":
            wait(lambda: registered() != "", "the first checkpoint registered (2 workers)")
            cluster.remove_node(workers.pop(), allow_graceful=False)
            note("removed a worker node")
        wait(lambda: sizes()[-1:] == [1], "an attempt at 1 worker")
        if shrink == "evict":  # the drained node's raylet leaves once nothing runs on it
            wait(lambda: len(alive(workers)) == 1, "the evicted node gone from the cluster")
            outcome["evicted"] = [w.node_id for w in workers if w not in alive(workers)]
            forget(cluster, workers, alive(workers))
        before = registered()
        wait(lambda: registered() != before, "a checkpoint of the 1-worker attempt registered")
        workers.append(cluster.add_node(**WORKER_NODE))
        note("added a worker node")
        thread.join(timeout=max(DEADLINE_S - (time.monotonic() - started), 1))
        note("fit returned" if not thread.is_alive() else "fit still running")
    except BaseException as e:
        outcome["error"] = f"scenario: {type(e).__name__}: {e}"
    outcome["finished"] = not thread.is_alive()
    outcome["timeline"] = timeline
    return outcome


if __name__ == "__main__":
    main(*sys.argv[1:])
