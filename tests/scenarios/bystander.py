"""Another run on the nodes the fleet evicts: `python -m tests.scenarios.bystander ADDRESS STORAGE
MARKER OUT_JSON`, started by tests/scenarios/evict.py as a job of its own (its own driver
process, as another team's job would be) on the evict scenario's cluster.

One RayOrmasTrainer fit of `tests.loops.accumulation_loop` (DDP, 4 micro-batches per optimizer
step, 6 optimizer steps) on 2 workers that need a `bystander_slot`, which only the evict
scenario's nodes A and B have: one rank on the node the evicting fit keeps out of its run. After
its 3rd optimizer step every rank waits until MARKER exists, which the scenario writes once the
evicting fit's next attempt has started elsewhere; then it trains to its end. What it returned
(or raised) goes to OUT_JSON, its ranks' files to STORAGE/bystander-ranks. tests/test_node_loss.py
reads both: it trained to its end, never restarted or preempted; and gradient accumulation
under DDP (the test of tests/test_strategies.py's subject, on this fit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.train import RunConfig, ScalingConfig

from ray_ormas import BatchSize, RayOrmasTrainer
from tests import loops

HOLD_TIMEOUT_S = 240.0


def main(address: str, storage: str, marker: str, out_json: str) -> None:
    ranks = Path(storage) / "bystander-ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    outcome: dict = {"ranks_dir": str(ranks)}
    ray.init(address=address, log_to_driver=False)
    try:
        result = RayOrmasTrainer(
            loops.accumulation_loop,
            check_every=2,
            verbose=False,
            mlflow=False,
            batch=BatchSize(64, per="global", accumulation=4),
            train_loop_config={
                "accumulation": 4,
                "micro_batches": 24,
                "out_dir": str(ranks),
                "hold_until": marker,
                "hold_after": 3,
                "hold_timeout_s": HOLD_TIMEOUT_S,
            },
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "bystander_slot": 1}),
            run_config=RunConfig(name="bystander", storage_path=storage),
        ).fit()
        outcome.update(
            record_dir=str(result.ormas.record_dir),
            final=result.ormas.final,
            worker_errors=[{str(k): v for k, v in e.items()} for e in result.ormas.worker_errors],
            error=None if result.error is None else f"{type(result.error).__name__}: {result.error}",
        )
    except BaseException as e:  # reported to the test, which fails on it
        outcome["error"] = f"{type(e).__name__}: {e}"
    finally:
        Path(out_json).write_text(json.dumps(outcome, default=str))
        ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
