"""The fleet's actions on a simulated multi-node cluster, run by tests/scenarios/elastic.py on its
cluster after the elastic fits (fit "acts"), for tests/test_fleet_actions.py.

The cluster's worker nodes have one training slot each, so the fit's two ranks run on
different nodes (neither is the head); a third is added first, the spare an evict restarts on.
The head has the one `trial_slot`, for the trial's actor. One fit carries five faults, one per
attempt, each injected by the test's loop (tests/loops.py `digits_loop`) or the test's policy,
never by a switch in the package; each of the loop's fires once per fit, whichever attempt
reaches its step first (`once_dir`):

    attempt 0   rank 1 changes its weights outside DDP after step 22: `divergence` at run step 25
                -> reattempt, from the checkpoint at run step 20 (not Ray's latest, 30, taken
                   after the replicas stopped agreeing)
    attempt 1   rank 1 blocks forever before step 32's backward: `hang` after hang_after_s, which
                names both ranks (rank 0 waits in the all-reduce) -> `["diagnose", "evict"]` is
                bounded: an evict would take every node of the group, so diagnose (py-spy, on
                the ranks' nodes: the stuck rank's stack), then reattempt (its workers ended),
                and the action's line says why; no node is kept out or drained
    attempt 2   rank 1 raises Ray's NCCLHangError at step 34: a worker failure, `nccl_hang`
                (no action: Ray's own failure policy restarts the group)
    attempt 3   before its first step, the pre-flight screen's own probe (tests/loops.py
                `StorageLostOnRank`) fails on rank 1: `preflight` -> evict: rank 1's node is
                kept out of the run (not drained: Ray's GCS is not told), and the group restarts
                on the node left and the spare, having trained nothing on it
    attempt 4   rank 1's loss is NaN at step 45: `nonfinite` -> stop, and at the same check the
                policy asks to reattempt: the most severe, the stop, is carried out (the
                policy's alarm is recorded as superseded): `FleetStopError`, which Ray does
                not retry (max_failures would allow one more restart)

The fit runs as the one trial of a Ray Tune sweep, as a fit in a sweep runs (the trainable
builds the trainer with `TuneReportCallback` and calls `fit()`), so every action here is also
carried out inside a Tune trial: the stop ends the trial, whose error Tune keeps. Each rank
writes its node's id when it starts (`node_log`), so the test knows where each attempt ran. The
outcome (the trial's error, the sweep's seconds, the nodes) goes to the scenario's JSON.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.tune.integration.ray_train import TuneReportCallback

from ray_ormas import FleetSettings, FleetStopError, RayOrmasError, RayOrmasTrainer
from tests.loops import StorageLostOnRank, digits_loop
from tests.scenarios import alive, draining_nodes, forget

HANG_AFTER_S = 4.0
POLICY = "tests.loops:reattempt_at_the_fifth_attempts_nan"
ACTIONS = {"divergence": "reattempt", "hang": ["diagnose", "evict"], "preflight": "evict", "nonfinite": "stop"}
RUN_NAME = "acts"


def acts_fit(cluster: Cluster, workers: list[Any], worker_node: dict[str, Any], storage: str) -> dict[str, Any]:
    """The sweep described above, its trial's fit on `workers` and a spare node added now
    (`worker_node`'s arguments: one `train_slot` each); the drained node is forgotten after."""
    once, node_log = Path(storage) / "once", Path(storage) / "nodes"
    once.mkdir(parents=True, exist_ok=True)
    node_log.mkdir(parents=True, exist_ok=True)
    workers.append(cluster.add_node(**worker_node))
    cluster.wait_for_nodes()
    loop_config = {
        "steps": 60,
        "tiny": True,
        "resume": True,
        "ormas_checkpoint": True,
        "report_at": [10, 20, 30, 40, 50],
        "once_dir": str(once),
        "node_log": str(node_log),
        "nudge_rank": 1,
        "nudge_at": 22,
        "block_rank": 1,
        "block_at": 32,
        "hang_rank": 1,
        "hang_at": 34,
        "nan_rank": 1,
        "nan_at": 45,
    }

    def trainable(config: dict[str, Any]) -> None:
        RayOrmasTrainer(
            digits_loop,
            check_every=5,
            verbose=False,
            train_loop_config=loop_config,
            fleet=FleetSettings(
                actions=ACTIONS,
                hang_after_s=HANG_AFTER_S,
                policy=POLICY,
                max_actions=4,
                # Its probe is the fault; this cluster runs beside the node-loss scenario on 2 cores,
                # so the timings are compared loosely (10x): a rank named slow too would make the
                # alarm name both ranks, and an evict of every node restarts in place instead.
                preflight={"factor": 10, "probes": [StorageLostOnRank(rank=1, call=4, count_dir=str(once))]},
            ),
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "train_slot": 1}),
            run_config=RunConfig(
                name=RUN_NAME,
                storage_path=storage,
                failure_config=FailureConfig(max_failures=5),
                callbacks=[TuneReportCallback()],
            ),
        ).fit()

    started = time.monotonic()
    outcome: dict[str, Any] = {}
    try:
        # The trial's own actor (the fit's driver) on the head node, which alone has a `trial_slot`.
        on_head = tune.with_resources(trainable, tune.PlacementGroupFactory([{"CPU": 1, "trial_slot": 1}]))
        [trial] = tune.Tuner(on_head, run_config=tune.RunConfig(name="sweep", storage_path=storage)).fit()
        error = trial.error
        if error is None:
            outcome["error"] = "the trial ended without an error: a FleetStopError was expected"
        else:
            outcome["raised"] = {
                "type": type(error).__name__,
                "message": str(error),
                "fleet_stop": isinstance(error, FleetStopError),
                "ray_ormas_error": isinstance(error, RayOrmasError),
            }
    except BaseException as e:  # reported to the test, which fails on it
        outcome["error"] = f"{type(e).__name__}: {e}"
    outcome["seconds"] = round(time.monotonic() - started, 1)
    outcome["starts"] = {name: (node_log / name).read_text() for name in sorted(os.listdir(node_log))}
    outcome["alive"] = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
    outcome["draining"] = draining_nodes()
    outcome["finished"] = True
    forget(cluster, workers, alive(workers))
    return outcome
