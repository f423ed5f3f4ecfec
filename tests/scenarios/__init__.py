"""Scenarios that need a simulated multi-node cluster of their own (`ray.cluster_utils.Cluster`),
run as separate processes by their tests.

`FAST_NODE_DEATH` is the head's GCS health check for them: a removed node is declared dead after
about 1.5 s (three missed 0.5 s checks) instead of Ray's default of about 15 s (five missed 3 s
checks). A cloud node that vanishes is noticed by the same check with the defaults; only how
long the scenario waits for Ray to notice changes, not what Ray or ray-ormas then does.

`alive` and `forget` keep a scenario's list of worker nodes true after the fleet drained one
(its raylet leaves the cluster once nothing runs on it). `draining_nodes` is what Ray Train's
`PreemptionWatcher` reads to preempt every run with a worker on a node: a run-scoped evict
must leave it empty.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.cluster_utils import Cluster

FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


def alive(nodes: list[Any]) -> list[Any]:
    """The nodes of `nodes` that Ray counts as alive."""
    living = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return [node for node in nodes if node.node_id in living]


def forget(cluster: Cluster, workers: list[Any], keep: list[Any]) -> None:
    """Drop the worker nodes not in `keep` from `workers` and from the cluster's own list."""
    for node in [w for w in workers if w not in keep]:
        workers.remove(node)
        try:
            cluster.remove_node(node, allow_graceful=False)
        except Exception:  # its raylet has already left
            pass


def draining_nodes() -> list[str]:
    """The nodes Ray's GCS is draining (hex ids), as Ray Train 2.60's `PreemptionWatcher` reads them
    (`ray/train/v2/_internal/execution/preemption.py`): a test's look at Ray's own state."""
    return sorted(ray._private.state.state.get_draining_nodes())


@ray.remote(num_cpus=0)
def node_of_task() -> str:
    """The node a task ran on (pinned by the caller: the node still takes new work)."""
    return ray.get_runtime_context().get_node_id()
