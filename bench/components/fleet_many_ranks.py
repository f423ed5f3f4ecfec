"""Fleet health in a real fit at many ranks on this machine (gloo, a tiny model): a benchmark, not in CI.

    python bench/components/fleet_many_ranks.py [--ranks 16] [--steps 80] [--check-every 5] [--slow-rank 5]

Starts a local Ray cluster with one logical CPU per rank (the ranks share this machine's cores,
so the step times say nothing of a real cluster's), runs one `RayOrmasTrainer` fit of a tiny MLP
on made-up data with fleet health on (MLflow off), rank `--slow-rank` waiting an extra
`--slow-s` seconds for its data at every step from `--slow-from` on, and prints:

* the head node's CPU time per check (`FleetSummary.head_ms_per_check`: analysis, record,
  metrics, the actions' bookkeeping), and per rank;
* the fleet record's bytes per check (checks.jsonl and alarms.jsonl, as written);
* the facts the ranks send per check: the pickled `RankFacts` of one rank of this model (one
  parameter group per layer), times the ranks;
* whether the slowed rank was named as a straggler slow in data loading, as at 2 ranks, and at
  which check after the slowing began.

bench/components/fleet_scale.py simulates the same head at up to 1,000 ranks without training.
"""

from __future__ import annotations

import argparse
import json
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any


def many_ranks_loop(config: dict[str, Any]) -> None:
    """A tiny MLP under DDP; rank `slow_rank` waits `slow_s` for its data from step `slow_from` on."""
    import ray.train
    import torch
    import torch.nn.functional as F

    import ray_ormas

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = ray_ormas.prepare_model(mlp)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = ray_ormas.monitor(model, opt)
    generator = torch.Generator().manual_seed(rank)
    for step in range(config["steps"]):
        if rank == config["slow_rank"] and step >= config["slow_from"]:
            time.sleep(config["slow_s"])  # before the forward pass: the probe counts it as data time
        x = torch.randn(16, 32, generator=generator)
        y = torch.randint(0, 4, (16,), generator=generator)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.step(loss)


def one_rank_facts(ranks: int, groups: int) -> int:
    """The pickled size of one rank's facts at a check, shaped as this fit's (worker/fleet_probe.py)."""
    from ray_ormas._internal.fleet.facts import RankFacts

    digest = "0123456789abcdef"
    facts = RankFacts(
        rank=ranks - 1, node="10.0.0.1", check=10, step=50, data_s=0.001, forward_s=0.002, wall_s=0.01,
        forwards=5, loss=1.2345678, digest=digest, groups=(digest[:8],) * groups,
    )  # fmt: skip
    return len(pickle.dumps(facts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--slow-rank", type=int, default=5)
    p.add_argument("--slow-from", type=int, default=20)
    p.add_argument("--slow-s", type=float, default=0.2)
    args = p.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig

    from ray_ormas import RayOrmasTrainer, open_records

    ray.init(num_cpus=args.ranks + 1, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            started = time.monotonic()
            result = RayOrmasTrainer(
                many_ranks_loop,
                train_loop_config={
                    "steps": args.steps,
                    "slow_rank": args.slow_rank,
                    "slow_from": args.slow_from,
                    "slow_s": args.slow_s,
                },
                check_every=args.check_every,
                verbose=False,
                mlflow=False,
                scaling_config=ScalingConfig(num_workers=args.ranks),
                run_config=RunConfig(name="many-ranks", storage_path=storage),
            ).fit()
            seconds = time.monotonic() - started
            fleet = result.ormas.fleet
            assert fleet is not None, "no fleet summary: fleet health was off"
            folder = Path(storage, "many-ranks", "ormas", "fleet")
            kept = ("checks.jsonl", "alarms.jsonl")
            written = sum(f.stat().st_size for f in folder.rglob("*.jsonl") if f.name in kept)
            checks = len(open_records(str(Path(storage, "many-ranks"))).fleet_checks()) // args.ranks
    finally:
        ray.shutdown()
    stragglers = [a for a in fleet.alarms if a["kind"] == "straggler"]
    named = [a for a in stragglers if a["ranks"] == [args.slow_rank] and a.get("slow_in") == "data"]
    first_slow_check = -(-args.slow_from // args.check_every)
    groups = 4  # the MLP's parameters, one digest group each
    facts = one_rank_facts(args.ranks, groups)
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "fit_s": round(seconds, 1),
                "checks": checks,
                "head_ms_per_check": round(fleet.head_ms_per_check or 0.0, 3),
                "head_us_per_rank_per_check": round((fleet.head_ms_per_check or 0.0) * 1000 / args.ranks, 1),
                "record_bytes_per_check": round(written / max(checks, 1)),
                "facts_bytes_per_rank_per_check": facts,
                "sent_bytes_per_check": facts * args.ranks,
                "slowed_rank_named": bool(named),
                "named_at_check": named[0]["check"] if named else None,
                "slowing_began_at_check": first_slow_check,
                "other_stragglers": [a["ranks"] for a in stragglers if a not in named],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
