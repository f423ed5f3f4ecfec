"""Node loss (and eviction) on a simulated multi-node cluster:
`python -m tests.scenarios.node_loss OUT_DIR NAME=MODE@STORAGE ...`.

`ray.cluster_utils.Cluster` starts a head node (the driver, Ray Train's controller and the run
ledger) and one worker node that hosts both training workers. Each fit named on the command
line then runs in turn on that cluster. Once the fit's first checkpoint is in storage, the
worker node is removed (its raylet and every process on it die, rank 0 included); in MODE
"replace" a fresh node is added and Ray Train restarts the worker group there from the
checkpoint, and the next fit starts on that node. The outcome of fit NAME goes to
OUT_DIR/NAME.json for tests/test_node_loss.py to check. `Cluster.add_node` works only from the
main thread, so `fit()` runs in a background thread. The cluster is always shut down.

MODE "evict" runs the fleet's `evict` action on nodes of its own (tests/scenarios/evict.py).

MODE "no-replacement" (last, since it leaves no worker node): no node is added. With
`FailureConfig(controller_failure_limit=1)` and `RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=5` (Ray
Train passes it to the fit's controller when the fit starts), the run must fail after about two
startup timeouts instead of waiting for a node forever (Ray's default limit is unlimited).

STORAGE is a local folder or an `s3://` URI (the S3 API server of tests/s3_server.py, found
through the environment this process inherits).
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer
from tests.loops import resume_loop
from tests.scenarios import FAST_NODE_DEATH
from tests.scenarios.evict import evict_fit

WORKER_NODE = {"num_cpus": 2, "resources": {"train_slot": 2}}
# Bounds on the waits, for a machine twice as slow as a slow day: a checkpoint registered before
# the node is lost, and the fit's end after it.
REGISTERED_WITHIN_S = 360
FIT_ENDS_WITHIN_S = 600


def main(out_dir: str, *fits: str) -> None:
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_NODE_DEATH})
    try:
        node = cluster.add_node(**WORKER_NODE)
        ray.init(address=cluster.address, log_to_driver=False)
        for spec in fits:
            name, rest = spec.split("=", 1)
            mode, storage = rest.split("@", 1)
            if mode == "evict":  # on nodes of its own (tests/scenarios/evict.py)
                outcome = evict_fit(cluster, storage)
            else:
                outcome, node = lose_the_node(cluster, node, storage, mode)
            (Path(out_dir) / f"{name}.json").write_text(json.dumps(outcome, default=str))
            if not outcome["finished"] or node is None:  # a fit still running, or no node left
                break
    finally:
        ray.shutdown()
        cluster.shutdown()


def lose_the_node(cluster: Cluster, node: Any, storage: str, mode: str) -> tuple[dict[str, Any], Any]:
    """One fit on `node`, which is removed after the fit's first registered checkpoint; the
    outcome, and the node the next fit can run on (the replacement; None without one)."""
    replace = mode == "replace"
    if not replace:
        os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "5"
    trainer = RayOrmasTrainer(
        resume_loop,
        train_loop_config={"epochs": 5, "sleep_per_step": 0.25},
        check_every=3,
        verbose=False,
        mlflow=False,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "train_slot": 1}),
        run_config=RunConfig(
            name="node-loss",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1, controller_failure_limit=-1 if replace else 1),
        ),
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            result = trainer.fit()
            outcome.update(
                return_value=result.return_value,
                final=result.ormas.final,
                worker_errors=[{str(k): v for k, v in e.items()} for e in result.ormas.worker_errors],
                digests=result.ormas.digests()[-1],
                not_uploaded=result.ormas.not_uploaded,
            )
        except BaseException as e:  # reported to the test, which fails on it
            outcome["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    fs, base = pafs.FileSystem.from_uri(storage) if "://" in storage else (pafs.LocalFileSystem(), storage)
    run_dir = posixpath.join(base, "node-loss")
    deadline = time.monotonic() + REGISTERED_WITHIN_S

    def checkpoints() -> list[str]:
        infos = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
        return [i.path for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")]

    def registered() -> bool:  # Ray's controller writes its checkpoint index once it took one
        return fs.get_file_info(posixpath.join(run_dir, "checkpoint_manager_snapshot.json")).type == pafs.FileType.File

    while not registered() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.2)
    outcome["checkpoints_before_loss"] = len(checkpoints())
    cluster.remove_node(node, allow_graceful=False)
    lost_at = time.monotonic()
    replacement = cluster.add_node(**WORKER_NODE) if replace else None
    thread.join(timeout=FIT_ENDS_WITHIN_S)
    outcome["seconds_after_loss"] = round(time.monotonic() - lost_at, 1)
    outcome["finished"] = not thread.is_alive()
    return outcome, replacement


if __name__ == "__main__":
    main(*sys.argv[1:])
