"""The controller side of a run-scoped `evict`: keeps the run's later worker groups off the nodes
the fleet evicted, and touches nothing else on the cluster.

It runs in Ray Train's controller. Before the controller starts a worker group (the first one, a
restart, an elastic resize) it asks each `ControllerCallback` for a label selector; this one asks
the run ledger (head/ledger.py `excluded_nodes`) which nodes this run's fleet evicted and
answers `{"ray.io/node-id": "!in(...)"}` (seams/ray_train.py), merged with the
`ScalingConfig.label_selector` the user gave. Ray then places the group's bundles on other nodes
only; other runs, jobs and Tune trials on those nodes are not told anything and go on.

Never fails a start: a ledger that does not answer within LEDGER_WAIT_S, or a user selector the
exclusion cannot be merged with, is one warning, and the group starts as Ray would have started
it.

Hooks relied on: Ray Train 2.60's `ControllerCallback.on_controller_start_worker_group`
(a private class, checked in seams/ray_train.py `controller_callback_class`), and
`ScalingConfig.label_selector` (public).
"""

from __future__ import annotations

from typing import Any

import ray

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.seams.ray_train import NODE_ID_LABEL, controller_callback_class, exclusion_selector

logger = get_logger("ray_ormas.fleet")
LEDGER_WAIT_S = 5.0


class NodeExclusion:
    """What the callback does (mixed into Ray's `ControllerCallback` by `node_exclusion_callback`)."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    def on_controller_start_worker_group(self, *, scaling_config: Any, num_workers: int) -> dict[str, str] | None:
        try:
            excluded = list(ray.get(self._ledger.excluded_nodes.remote(), timeout=LEDGER_WAIT_S))
        except Exception as e:  # the ledger is gone or slow: the group starts as Ray would start it
            logger.warning("fleet: could not ask the ledger which nodes this run evicted (%s: %s)", type(e).__name__, e)
            return None
        if not excluded:
            return None
        return merged_selector(scaling_config.label_selector, excluded)


def merged_selector(given: Any, excluded: list[str]) -> dict[str, str] | None:
    """The user's `ScalingConfig.label_selector` with the exclusion of `excluded` added; None (said)
    when they cannot be merged: per-worker selectors that differ, or one that already names nodes."""
    ours = exclusion_selector(excluded)
    if isinstance(given, list):
        distinct = [dict(s) for s in given if dict(s) != dict(given[0])]
        if distinct:
            logger.warning(
                "fleet: the evicted nodes %s cannot be kept out of this run: ScalingConfig.label_selector gives "
                "each worker its own selector, and a worker group takes one (the group may land on them again)",
                ", ".join(excluded),
            )
            return None
        given = dict(given[0]) if given else None
    if given and NODE_ID_LABEL in given:
        logger.warning(
            "fleet: the evicted nodes %s cannot be kept out of this run: ScalingConfig.label_selector already "
            "selects by %s (%s)",
            ", ".join(excluded),
            NODE_ID_LABEL,
            given[NODE_ID_LABEL],
        )
        return None
    return {**(given or {}), **ours}


def node_exclusion_callback(ledger: Any) -> Any:
    """A Ray Train `ControllerCallback` for `RunConfig.callbacks` that keeps the run's later worker
    groups off the nodes the run's fleet evicted (raises `RaySeamChanged` when Ray's hook changed)."""
    cls = type("NodeExclusionCallback", (NodeExclusion, controller_callback_class()), {"__module__": __name__})
    return cls(ledger)
