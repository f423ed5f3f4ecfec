"""The fleet's `evict` action on a simulated multi-node cluster, run by tests/scenarios/node_loss.py
on its cluster (mode "evict", before the node-loss fits; the nodes it adds are removed after it).

Two worker nodes, A and B, with one training slot each (`evict_slot`, a resource the node-loss
fits do not use), host the fit's two ranks. The rank on node A is slow in data loading (the
loop's `slow_node`): a slow node, not a slow rank.

    attempt 0   on A and B. Before its first step, the pre-flight screen names both: node A is
                made slow for real (its workers under a CPU quota of a fifth of a CPU, tests/scenarios/cpu_quota.py,
                lifted once the ranks' loops start), and the screen's own probe
                (tests/loops.py `FailOnNode`) fails on node B. The screen's action is the default,
                `log`: the fit trains on. Then the straggler alarm names A's rank (data loading) within three
                checks -> `evict` (FleetSettings.actions): node A is kept out of the run (not
                drained: Ray's GCS is not told) and the group restarts from Ray's latest
                checkpoint. Nodes C and D are added once attempt 0 is placed: the spares.
                Attempt 0's ranks wait at step 3 until they have joined (on a loaded
                machine adding them took longer than the alarm: the evict found no room).
    attempt 1   on two of B, C and D, never A: no straggler alarm. The test's policy
                (tests/loops.py `evict_rank_1_after_the_first_attempt`) evicts rank 1's node at
                the attempt's check 3 (the spare left gives the group room).
    attempt 2   on the two nodes left of B, C and D: the policy asks again, and `max_actions=2`
                is reached: the alarm only logs ("bounded"), and the fit runs to its end.

Beside it, another job (tests/scenarios/bystander.py, a driver process of its own) trains on
A and B (a `bystander_slot` each, which the spares lack): placed before the evicting fit starts,
it waits after its 3rd optimizer step until attempt 1 has started, then trains to its end. It is
never restarted or preempted: the run-scoped evict touched nothing of it.

Each rank writes its node's id when it starts (`node_log`), so the test knows which nodes each
attempt ran on. At the end, node A is still alive, Ray's GCS drains no node, and a task pinned
to A runs there: another run on it would have gone on. The outcome goes to the scenario's JSON
for tests/test_node_loss.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ormas import FleetSettings, RayOrmasTrainer
from tests.loops import FailOnNode, digits_loop
from tests.scenarios import draining_nodes, node_of_task
from tests.scenarios.cpu_quota import CpuQuota

SLOT_NODE = {"num_cpus": 1, "resources": {"evict_slot": 1}}
SHARED_NODE = {"num_cpus": 2, "resources": {"evict_slot": 1, "bystander_slot": 1}}  # A and B: the other job too
STEPS = 75  # attempt 2 starts at run step 50: its check 3 is at 65
DEADLINE_S = 600  # the evicting fit's whole run, for a machine twice as slow as a slow day
BYSTANDER_START_S = 240  # the other job's two ranks placed, before the evicting fit starts
BYSTANDER_END_S = 360  # the other job's end, after the evicting fit's
QUOTA_SHARE = 0.2  # node A's workers get a fifth of a CPU until attempt 0 trains
# The screen's factor: a fixed quota makes A's matmul about 5x its usual time, while B's grows with
# the load of the scenario beside this one on the same two cores (B's took twice its usual in a
# CI run): at 1.5, B may be 3.3x slower than usual before A goes unnamed.
SCREEN_FACTOR = 1.5
# The slow node's data loading per step, from step 18. A check names it only while the extra time
# is at least min_excess (0.2) x the fleet's median step time: at 0.05 s the steps' median of the
# other work (compute, all-reduce) had to stay under 0.2 s, and in a CI run on a loaded machine one
# check of three did not (the alarm came at the 4th slow check). At 0.25 s it may reach 1 s.
SLOW_DATA_S = 0.25


def evict_fit(cluster: Cluster, storage: str) -> dict[str, Any]:
    """The fit described above, on nodes it adds to `cluster` and removes at its end."""
    node_log = Path(storage) / "nodes"
    node_log.mkdir(parents=True, exist_ok=True)
    nodes = {"A": cluster.add_node(**SHARED_NODE), "B": cluster.add_node(**SHARED_NODE)}
    cluster.wait_for_nodes()
    quota = CpuQuota(nodes["A"], share=QUOTA_SHARE)  # node A slow for real, until attempt 0 trains
    try:
        return evict_fit_on(cluster, storage, nodes, node_log, quota)
    finally:
        quota.release()


def evict_fit_on(cluster: Cluster, storage: str, nodes: dict[str, Any], node_log: Path, quota: CpuQuota) -> dict:
    bystander, marker, bystander_out = start_the_other_job(cluster, storage)
    spares_joined = Path(storage) / "spares-joined"
    trainer = RayOrmasTrainer(
        digits_loop,
        check_every=5,
        verbose=False,
        train_loop_config={
            "steps": STEPS,
            "tiny": True,
            "resume": True,
            "report_at": [10, 20, 30, 40, 50],
            "ormas_checkpoint": True,
            "slow_node": nodes["A"].node_id,
            "slow_from": 18,
            "slow_s": SLOW_DATA_S,
            "hold_at": 3,  # before the first slow step, until the spares have joined
            "hold_until": str(spares_joined),
            "node_log": str(node_log),
        },
        fleet=FleetSettings(
            actions={"straggler": "evict"},
            policy="tests.loops:evict_rank_1_after_the_first_attempt",
            max_actions=2,
            # A longer matmul than the default 512 (about 40 ms here): a descheduled millisecond
            # on the busy test machine does not count, a node with a fifth of a CPU does.
            preflight={"matmul_size": 1024, "factor": SCREEN_FACTOR, "probes": [FailOnNode(nodes["B"].node_id)]},
        ),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "evict_slot": 1}),
        run_config=RunConfig(name="evict", storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    outcome: dict[str, Any] = {"nodes": {name: node.node_id for name, node in nodes.items()}}

    def run() -> None:
        try:
            result = trainer.fit()
            fleet = result.ormas.fleet
            outcome.update(
                return_value=result.return_value,
                mlflow_run_id=result.ormas.mlflow_run_id,
                alarms=fleet.alarms if fleet else None,
                actions=fleet.actions if fleet else None,
                ranks=fleet.ranks if fleet else None,
                checks=fleet.checks if fleet else None,
                table=fleet.table() if fleet else None,
                preflight=fleet.preflight if fleet else None,
            )
        except BaseException as e:  # reported to the test, which fails on it
            outcome["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()

    def wait_for_starts(count: int) -> bool:
        while len(os.listdir(node_log)) < count:
            if time.monotonic() - started > DEADLINE_S or not thread.is_alive():
                return False
            time.sleep(0.2)
        return True

    # The spares are added once attempt 0 is placed, so that it runs on A and B; both are there
    # before any evict (an evict that left no room for the group would restart it in place).
    for spare, placed in (("C", 2), ("D", 2)):
        if not wait_for_starts(placed):
            break
        quota.release()  # attempt 0's ranks have been screened and train: node A as fast as B again
        nodes[spare] = cluster.add_node(**SLOT_NODE)
        outcome["nodes"][spare] = nodes[spare].node_id
    cluster.wait_for_nodes()
    spares_joined.write_text("C and D")  # attempt 0 trains on; an evict now has room elsewhere
    wait_for_starts(4)  # attempt 1 has started, on other nodes (or the fit has ended)
    marker.write_text("the evicting fit's attempt 1 has started")  # the other job trains on
    thread.join(timeout=max(DEADLINE_S - (time.monotonic() - started), 1))
    outcome["finished"] = not thread.is_alive()
    outcome["bystander"] = the_other_jobs_end(bystander, bystander_out)
    outcome["starts"] = {name: (node_log / name).read_text() for name in sorted(os.listdir(node_log))}
    outcome["alive"] = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
    outcome["draining"] = draining_nodes()
    # The evicted node A was only kept out of this run: other work is still placed there.
    pinned = NodeAffinitySchedulingStrategy(nodes["A"].node_id, soft=False)
    try:
        outcome["ran_on_a"] = ray.get(node_of_task.options(scheduling_strategy=pinned).remote(), timeout=60)
    except Exception as e:  # reported to the test, which fails on it
        outcome["ran_on_a"] = f"{type(e).__name__}: {e}"
    if outcome["finished"]:
        for node in nodes.values():
            try:
                cluster.remove_node(node, allow_graceful=False)
            except Exception:  # a drained node's raylet has already left the cluster
                pass
    return outcome


def start_the_other_job(cluster: Cluster, storage: str) -> tuple[subprocess.Popen, Path, Path]:
    """tests/scenarios/bystander.py in a process of its own, once both of its ranks have started
    (on A and B): the process, the marker that lets it train on, and where its outcome goes."""
    marker, out = Path(storage) / "bystander-go", Path(storage) / "bystander.json"
    ranks = Path(storage) / "bystander-ranks"
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.scenarios.bystander", cluster.address, storage, str(marker), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=open(Path(storage) / "bystander.log", "w"),  # noqa: SIM115 (the process keeps it)
    )
    deadline = time.monotonic() + BYSTANDER_START_S
    while time.monotonic() < deadline and job.poll() is None:
        if ranks.is_dir() and len(list(ranks.glob("start-rank*"))) >= 2:
            break
        time.sleep(0.2)
    return job, marker, out


def the_other_jobs_end(job: subprocess.Popen, out: Path) -> dict[str, Any]:
    """What the other job returned, once it ended (it is killed if it has not within the bound)."""
    try:
        job.wait(timeout=BYSTANDER_END_S)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait(timeout=30)
        return {"error": f"the other job did not end within {BYSTANDER_END_S:g} s"}
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError) as e:
        return {"error": f"the other job left no outcome ({type(e).__name__}: {e}), exit code {job.returncode}"}
