"""One relay per worker node and fit: the node's ranks hand it their fleet facts, and the head
gets one message per node per check, 49 bytes per rank.

Runs as a small async Ray actor on the ranks' node (`FleetRelay`, no CPU). The run ledger creates
it when the node's first rank of an attempt asks (`RunLedger.fleet_relay`, pinned to the node) and
owns it; it serves that attempt only, and the ledger ends it when the attempt's worker group fails
or the next attempt begins. An actor left on a node would keep the node from draining (Ray waits
for what runs there) and from being scaled down.

The ranks' calls are node-local and never awaited by the loop (worker/fleet_probe.py reads the
answer at its next check, as before; until the relay has started, a rank sends its facts to the
ledger itself): the relay adds no synchronisation the loop did not have.

    rank r, check c   -> relay.facts(token, local ranks, RankFacts)
                         keeps its parameter-group digests (the last KEEP_CHECKS checks), packs the
                         row (fleet/wire.py)
    every local rank in, or FLUSH_S after the first -> ledger.fleet_batch(rows, intros): one call
    the ledger's answer, once the check is complete  -> each rank's call returns the attempt's order
    or, when the head holds the check for a divergence, the ranks whose parameter-group digests
    locate it -> ledger.fleet_groups(their digests), whose answer is the order

A rank that is late (stuck before its check) does not hold its node's others back: FLUSH_S after
the first, what came goes, and the late rank's row follows alone. The hang watch then names the
late rank, as before.

Hooks relied on: Ray async actors (`asyncio` methods, awaiting an `ObjectRef`),
`NodeAffinitySchedulingStrategy`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import ray

from ray_ormas._internal.common.fleet_records import Order
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import Intro, intro_of, pack

FLUSH_S = 1.0  # a check's rows go at most this long after its first one came
KEEP_CHECKS = 4  # the checks whose parameter-group digests a relay keeps, for a divergence


@dataclass
class _Batch:
    rows: list[tuple[bytes, dict[str, Any] | None]] = field(default_factory=list)
    intros: dict[int, Intro] = field(default_factory=dict)
    answer: asyncio.Future[Order | None] | None = None
    timer: asyncio.Task[None] | None = None


class NodeRelay:
    """The relay of one node's ranks in one fit (see the module docstring); an async class that
    `FleetRelay` runs as an actor."""

    def __init__(self, ledger: Any, flush_s: float = FLUSH_S) -> None:
        self._ledger = ledger
        self._flush_s = flush_s
        self._batches: dict[tuple[str, int], _Batch] = {}  # (attempt token, check) -> its rows so far
        self._introduced: set[tuple[str, int]] = set()  # (token, rank)
        self._groups: dict[tuple[str, int], dict[int, tuple[str, ...]]] = {}  # (token, check) -> rank -> digests
        self.messages = 0  # calls to the ledger (fleet_batch, fleet_groups)

    async def facts(self, token: str, local_ranks: int, facts: RankFacts) -> Order | None:
        """One rank's facts at one check (`local_ranks`: its attempt's ranks on this node);
        returns the attempt's order once the head has the check complete (or None)."""
        self._keep_groups(token, facts)
        key = (token, facts.check)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch(answer=asyncio.get_running_loop().create_future())
            batch.timer = asyncio.create_task(self._flush_later(key))
        row, extras = pack(facts)
        batch.rows.append((row, extras))
        if (token, facts.rank) not in self._introduced:
            self._introduced.add((token, facts.rank))
            batch.intros[facts.rank] = intro_of(facts)
        if len(batch.rows) >= max(1, local_ranks):
            await self._flush(key)
        assert batch.answer is not None
        return await batch.answer

    async def _flush_later(self, key: tuple[str, int]) -> None:
        await asyncio.sleep(self._flush_s)
        await self._flush(key)

    async def _flush(self, key: tuple[str, int]) -> None:
        batch = self._batches.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None and batch.timer is not asyncio.current_task():
            batch.timer.cancel()
        token, check = key
        order: Order | None = None
        self.messages += 1
        with contextlib.suppress(Exception):  # a gone ledger: no order, as a rank's direct call would get
            order, wanted = await self._ledger.fleet_batch.remote(token, batch.rows, batch.intros)
            if wanted:  # the head holds the check for a divergence: the digests that locate it
                held = self._groups.get(key, {})
                self.messages += 1
                order = await self._ledger.fleet_groups.remote(token, check, {r: held[r] for r in wanted if r in held})
        assert batch.answer is not None
        if not batch.answer.done():
            batch.answer.set_result(order)

    def _keep_groups(self, token: str, facts: RankFacts) -> None:
        if facts.groups:
            self._groups.setdefault((token, facts.check), {})[facts.rank] = facts.groups
            while len(self._groups) > KEEP_CHECKS:  # the oldest check first (insertion order)
                del self._groups[next(iter(self._groups))]


FleetRelay = ray.remote(num_cpus=0)(NodeRelay)


def start_relay(ledger: Any, node_id: str) -> Any:
    """A relay on node `node_id` (hex id) for the ledger `ledger`, owned by the caller."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return FleetRelay.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(ledger)
