"""The head's cost of fleet health with the messages included: a real Ray actor receiving them.

    python bench/components/fleet_messages.py [--ranks 64 1000] [--nodes-of 8] [--checks 10]
                                              [--paths relays ranks]

Starts a local Ray cluster, the real run ledger actor (head/ledger.py, with the fleet view and
its Parquet record on local disk, Ray's metrics on), and one actor per simulated node
(`--nodes-of` ranks each). At each check every node sends its ranks' facts, by one of two paths:

- `relays` (what the ranks do): the node's actor runs the real relay (node/fleet_relay.py's
  `NodeRelay`, in the actor's process as in a `FleetRelay` actor), which each rank hands its
  facts, 49-byte rows; the nodes grouped as the ledger groups relays (GROUP_NODES a group, the
  first leading): one `fleet_batch` call per group per check;
- `ranks` (before the relays, and while a node's relay starts): one `fleet_facts` call per rank
  with its whole facts.

Facts are shaped as bench/components/fleet_scale.py's. Once the head has answered every rank (it
answers once the check is complete), the next check starts: nothing polls the ledger meanwhile.
Prints per path and world size: messages per check, bytes per rank per check (the pickled
arguments of a node's call), and the head process's CPU time per check, in all (Ray's receiving
threads, the event loop, the analysis, the record, Ray's metrics) and for the analysis and what
follows it alone (`FleetHead`'s own count), from the ledger process's CPU times before and after
the checks. The first two checks warm up and are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import random
import tempfile
import time
from typing import Any

import ray

from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import intro_of, pack
from ray_ormas._internal.head.fleet_head import FleetSpec
from ray_ormas._internal.head.ledger import RunLedger
from ray_ormas._internal.node.fleet_relay import GROUP_NODES, NodeRelay
from ray_ormas._internal.record.store import RecordStore

WARM_CHECKS = 2
TOKEN = "bench-attempt"


def rank_facts(rank: int, check: int, rng: random.Random) -> RankFacts:
    digest = f"{check:016x}"
    return RankFacts(
        rank=rank,
        node=f"10.0.{rank // 8 // 256}.{rank // 8 % 256}",
        check=check,
        step=check * 50,
        data_s=0.001 + rng.random() * 0.0005,
        forward_s=0.020 + rng.random() * 0.002,
        wall_s=0.1,
        timed_steps=8,
        forwards=8,
        loss=2.0 + rng.random(),
        digest=digest,
        groups=(digest[:8],) * 64,
    )


@ray.remote(num_cpus=0)
class Node:
    """The ranks of one simulated node: each sends its facts as a rank does, through the node's
    relay or straight to the ledger."""

    def __init__(self, ledger: Any, ranks: list[int], upstream: Any = None) -> None:
        self._ledger = ledger
        self._ranks = ranks
        self._rng = random.Random(ranks[0])
        self._relay = NodeRelay(ledger, upstream, name=str(ranks[0]))

    async def forward(self, *args: Any) -> Any:
        """As the leader of its group: a member's rows (NodeRelay.forward)."""
        return await self._relay.forward(*args)

    async def send(self, check: int, path: str) -> int:
        """The node's ranks' facts at `check`; returns the bytes sent once the head has answered
        every rank (the answer comes once the check is complete)."""
        facts = [rank_facts(rank, check, self._rng) for rank in self._ranks]
        if path == "ranks":
            await asyncio.gather(*(self._ledger.fleet_facts.remote(TOKEN, f) for f in facts))
            return sum(len(pickle.dumps((TOKEN, f))) for f in facts)
        intros = {f.rank: intro_of(f) for f in facts} if check == 0 else {}
        await asyncio.gather(*(self._relay.facts(TOKEN, len(facts), f) for f in facts))
        packed = [pack(f) for f in facts]
        extras = {f.rank: x for f, (_, x) in zip(facts, packed) if x}
        return len(pickle.dumps((TOKEN, b"".join(r for r, _ in packed), extras, intros)))


def _cpu_and_count(ledger_self: Any) -> tuple[float, float, int]:
    fleet = ledger_self._fleet
    return time.process_time(), fleet._head_s, fleet._complete  # the process's CPU, every thread


def measure(world: int, per_node: int, checks: int, path: str, group: int = GROUP_NODES) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        spec = FleetSpec(FleetSettings(), RecordStore.at(tmp), "bench", "bench", world, "ddp")
        ledger = RunLedger.options(num_cpus=0).remote(None, spec)
        ray.get(ledger.begin_attempt.remote(TOKEN, world))
        ray.get(ledger.fleet_offset.remote(TOKEN, 0))
        nodes: list[Any] = []
        for first in range(0, world, per_node):  # grouped as the ledger groups relays (GROUP_NODES)
            leader = nodes[len(nodes) - len(nodes) % group] if len(nodes) % group else None
            nodes.append(Node.remote(ledger, list(range(first, min(first + per_node, world))), leader))
        sent = []
        start = None
        for check in range(checks):
            if check == WARM_CHECKS:
                start = ray.get(ledger.__ray_call__.remote(_cpu_and_count))
            sent.append(sum(ray.get([n.send.remote(check, path) for n in nodes])))  # the check complete
        end = ray.get(ledger.__ray_call__.remote(_cpu_and_count))
        ray.get(ledger.finish_fleet.remote())
        ray.kill(ledger)
        for n in nodes:
            ray.kill(n)
    assert start is not None
    measured = checks - WARM_CHECKS
    return {
        "path": path,
        "world": world,
        "messages": world if path == "ranks" else -(-len(nodes) // group),
        "bytes_per_rank": sum(sent) / len(sent) / world,
        "head_ms": (end[0] - start[0]) / measured * 1000,
        "analysis_ms": (end[1] - start[1]) / measured * 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 1000])
    p.add_argument("--nodes-of", type=int, default=8, help="ranks per simulated node (default 8)")
    p.add_argument("--checks", type=int, default=10, help="checks per world size, the first 2 warm-up (default 10)")
    p.add_argument("--paths", nargs="+", choices=["relays", "ranks"], default=["relays", "ranks"])
    p.add_argument(
        "--group-nodes",
        type=int,
        default=GROUP_NODES,
        help=f"nodes per relay group (default {GROUP_NODES}, as the ledger groups them); with --nodes-of "
        f"{GROUP_NODES * 8} --group-nodes 1, one actor per group sends what a group's leader sends (the "
        "10,000-rank point on a small machine)",
    )
    args = p.parse_args()
    if args.checks <= WARM_CHECKS:
        p.error(f"--checks must be more than the {WARM_CHECKS} warm-up checks")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        print(
            f"{'path':>6} {'ranks':>6} {'messages/check':>14} {'bytes/rank/check':>16} "
            f"{'head ms/check':>13} {'analysis ms':>11}"
        )
        for path, world in ((path, world) for path in args.paths for world in args.ranks):
            r = measure(world, args.nodes_of, args.checks, path, args.group_nodes)
            print(
                f"{r['path']:>6} {r['world']:>6} {r['messages']:>14} {r['bytes_per_rank']:>16.0f} "
                f"{r['head_ms']:>13.2f} {r['analysis_ms']:>11.2f}",
                flush=True,
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
