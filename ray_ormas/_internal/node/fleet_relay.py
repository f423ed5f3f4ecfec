"""One relay per worker node and attempt: the node's ranks hand it their fleet facts, 49 bytes a
rank, and the head gets one message per group of GROUP_NODES nodes per check.

Runs as a small async Ray actor on the ranks' node (`FleetRelay`, no CPU). The run ledger creates
it when the node's first rank of an attempt asks (`RunLedger.fleet_relay`, pinned to the node) and
owns it; it serves that attempt only, and the ledger ends it when the attempt's worker group fails
or the next attempt begins. An actor left on a node would keep the node from draining (Ray waits
for what runs there) and from being scaled down.

The relays of an attempt form groups of GROUP_NODES, in the order the ledger started them: the
first of each group leads it (`upstream` None: it sends to the ledger), the others send their
node's rows to their leader (`upstream`), which sends the head the group's rows in one message.
Ray's cost of receiving a message is the head's largest cost at scale (about a millisecond of CPU
each on a small head), so 125 nodes make 4 messages a check, not 125.

The ranks' calls are node-local and never awaited by the loop (worker/fleet_probe.py reads the
answer at its next check, as before; until the relay has started, a rank sends its facts to the
ledger itself): the relays add no synchronisation the loop did not have.

    rank r, check c   -> relay.facts(token, local ranks, RankFacts)
                         keeps its parameter-group digests (the last KEEP_CHECKS checks), packs the
                         row (fleet/wire.py)
    every local rank in, or FLUSH_S after the first -> the node's rows, as one `bytes`:
        a member          -> leader.forward(member, token, check, rows, extras, intros)
        the leader        -> its own `forward`
    leader: every member's rows are in (the ledger has it `join` each), or FLUSH_S after the first
                      -> ledger.fleet_batch(the group's rows, extras, intros): one call
    the ledger's answer, once the check is complete  -> each rank's call returns the attempt's order
    or, when the head holds the check for a divergence, the ranks whose parameter-group digests
    locate it: their relay sends them (ledger.fleet_groups), whose answer is the order; the
    group's other nodes get the order from one `fleet_groups` call with no digests

A rank or a node that is late (stuck before its check) does not hold the others back: FLUSH_S
after the first, what came goes, and the late rows follow alone. The hang watch then names the
late ranks, as before. A member whose leader is gone (its node lost) sends to the ledger itself.

Hooks relied on: Ray async actors (`asyncio` methods, awaiting an `ObjectRef`),
`NodeAffinitySchedulingStrategy`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import ray

from ray_ormas._internal.common.fleet_records import Order
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import Intro, intro_of, pack, rows_at

FLUSH_S = 1.0  # a check's rows go at most this long after its first one came (at a node, at a leader)
KEEP_CHECKS = 4  # the checks whose parameter-group digests a relay keeps, for a divergence
GROUP_NODES = 32  # the nodes whose rows one leading relay sends the head together
Answer = tuple[Order | None, tuple[int, ...]]  # (the order, or the ranks whose group digests are wanted)


@dataclass
class _Batch:
    """One node's rows at one check, while its ranks come."""

    rows: list[bytes] = field(default_factory=list)
    extras: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> what its row leaves out
    intros: dict[int, Intro] = field(default_factory=dict)
    answer: asyncio.Future[Order | None] | None = None
    timer: asyncio.Task[None] | None = None


@dataclass
class _GroupBatch:
    """A leader's group's rows at one check, while its members' come."""

    parts: dict[str, tuple[bytes, list[int]]] = field(default_factory=dict)  # member -> (rows, ranks)
    extras: dict[int, dict[str, Any]] = field(default_factory=dict)
    intros: dict[int, Intro] = field(default_factory=dict)
    answer: asyncio.Future[Answer] | None = None
    rest: asyncio.Future[Order | None] | None = None  # the order, for the members not asked for digests
    timer: asyncio.Task[None] | None = None


class NodeRelay:
    """The relay of one node's ranks in one attempt, and maybe its group's leader (see the module
    docstring); an async class that `FleetRelay` runs as an actor."""

    def __init__(self, ledger: Any, upstream: Any = None, name: str = "", flush_s: float = FLUSH_S) -> None:
        self._ledger = ledger
        self._upstream = upstream  # the group's leading relay; None: this one leads, to the ledger
        self._name = name  # this relay's name among its group's members (its node's id)
        self._flush_s = flush_s
        self._batches: dict[tuple[str, int], _Batch] = {}  # (attempt token, check) -> its rows so far
        self._introduced: set[tuple[str, int]] = set()  # (token, rank)
        self._groups: dict[tuple[str, int], dict[int, tuple[str, ...]]] = {}  # (token, check) -> rank -> digests
        self._members: set[str] = {name}  # as a leader: the group's relays (`join`), itself included
        self._group_batches: dict[tuple[str, int], _GroupBatch] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # running on their own (kept from the collector)
        self.messages = 0  # calls to the ledger (fleet_batch, fleet_groups)

    async def facts(self, token: str, local_ranks: int, facts: RankFacts) -> Order | None:
        """One rank's facts at one check (`local_ranks`: its attempt's ranks on this node);
        returns the attempt's order once the head has the check complete (or None)."""
        self._keep_groups(token, facts)
        key = (token, facts.check)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch(answer=asyncio.get_running_loop().create_future())
            batch.timer = asyncio.create_task(_later(self._flush_s, self._flush, key))
        row, extras = pack(facts)
        batch.rows.append(row)
        if extras:
            batch.extras[facts.rank] = extras
        if (token, facts.rank) not in self._introduced:
            self._introduced.add((token, facts.rank))
            batch.intros[facts.rank] = intro_of(facts)
        if len(batch.rows) >= max(1, local_ranks):
            await self._flush(key)
        assert batch.answer is not None
        return await batch.answer

    async def _flush(self, key: tuple[str, int]) -> None:
        """The node's rows at one check go up (to the leader, or as the leader), and the answer
        comes back to its ranks."""
        batch = self._batches.pop(key, None)
        if batch is None:
            return
        _stop(batch.timer)
        token, check = key
        order: Order | None = None
        with contextlib.suppress(Exception):  # a gone ledger: no order, as a rank's direct call would get
            order, wanted = await self._send_up(token, check, b"".join(batch.rows), batch.extras, batch.intros)
            if wanted:  # the head holds the check for a divergence: the digests that locate it
                held = self._groups.get(key, {})
                self.messages += 1
                order = await self._ledger.fleet_groups.remote(token, check, {r: held[r] for r in wanted if r in held})
        assert batch.answer is not None
        if not batch.answer.done():
            batch.answer.set_result(order)

    async def _send_up(
        self, token: str, check: int, rows: bytes, extras: dict[int, dict[str, Any]], intros: dict[int, Intro]
    ) -> Answer:
        if self._upstream is None:
            return await self.forward(self._name, token, check, rows, extras, intros)
        try:
            answer: Answer = await self._upstream.forward.remote(self._name, token, check, rows, extras, intros)
            return answer
        except Exception:  # the leader is gone (its node lost): to the ledger itself
            self.messages += 1
            answer = await self._ledger.fleet_batch.remote(token, rows, extras, intros)
            return answer

    # ------------------------------------------------------------------ as the group's leader
    def join(self, member: str) -> None:
        """Relay `member` sends this one its node's rows: a check's rows go once its are in."""
        self._members.add(member)

    async def forward(
        self,
        member: str,
        token: str,
        check: int,
        rows: bytes,
        extras: dict[int, dict[str, Any]],
        intros: dict[int, Intro],
    ) -> Answer:
        """A member's node rows at `check` (this relay's own among them): the answer for them, once
        the group's rows have gone to the ledger together and the ledger has answered."""
        self._members.add(member)
        key = (token, check)
        group = self._group_batches.get(key)
        if group is None:
            loop = asyncio.get_running_loop()
            group = self._group_batches[key] = _GroupBatch(answer=loop.create_future(), rest=loop.create_future())
            group.timer = asyncio.create_task(_later(self._flush_s, self._send_group, key))
        group.parts[member] = (rows, rows_at(rows)[2])
        group.extras.update(extras)
        group.intros.update(intros)
        if self._members <= group.parts.keys():
            await self._send_group(key)
        assert group.answer is not None and group.rest is not None
        order, wanted = await group.answer
        if not wanted:
            return order, ()
        mine = tuple(r for r in wanted if r in set(group.parts[member][1]))
        return (None, mine) if mine else (await group.rest, ())

    async def _send_group(self, key: tuple[str, int]) -> None:
        group = self._group_batches.pop(key, None)
        if group is None:
            return
        _stop(group.timer)
        token, check = key
        assert group.answer is not None and group.rest is not None
        answer: Answer = (None, ())
        with contextlib.suppress(Exception):  # a gone ledger: no order
            rows = b"".join(rows for rows, _ in group.parts.values())
            self.messages += 1
            answer = await self._ledger.fleet_batch.remote(token, rows, group.extras, group.intros)
        group.answer.set_result(answer)  # the members asked for digests send them now
        asked = set(answer[1])
        if asked and any(not asked & set(ranks) for _, ranks in group.parts.values()):
            # The others wait for the check's order, in one call, on a task of its own: the caller
            # may be a member asked for digests, which it must be free to send first.
            task = asyncio.create_task(self._order_for_the_rest(token, check, group.rest))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            group.rest.set_result(None)

    async def _order_for_the_rest(self, token: str, check: int, rest: asyncio.Future[Order | None]) -> None:
        order: Order | None = None
        with contextlib.suppress(Exception):  # a gone ledger: no order
            self.messages += 1
            order = await self._ledger.fleet_groups.remote(token, check, {})
        rest.set_result(order)

    def _keep_groups(self, token: str, facts: RankFacts) -> None:
        if facts.groups:
            self._groups.setdefault((token, facts.check), {})[facts.rank] = facts.groups
            while len(self._groups) > KEEP_CHECKS:  # the oldest check first (insertion order)
                del self._groups[next(iter(self._groups))]


async def _later(delay_s: float, send: Callable[[tuple[str, int]], Awaitable[None]], key: tuple[str, int]) -> None:
    """`send(key)` after `delay_s`: what came of a check goes, late comers or not."""
    await asyncio.sleep(delay_s)
    await send(key)


def _stop(timer: asyncio.Task[None] | None) -> None:
    """A check's timer, once its rows went before it fired (not when it is the one sending)."""
    if timer is not None and timer is not asyncio.current_task():
        timer.cancel()


FleetRelay = ray.remote(num_cpus=0)(NodeRelay)


def start_relay(ledger: Any, node_id: str, upstream: Any = None, name: str | None = None) -> Any:
    """A relay on node `node_id` (hex id) for the ledger `ledger`, owned by the caller; `upstream`:
    its group's leading relay (None: it leads), told of it first; `name`: its name among the
    group's relays (its node's id)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = name or node_id
    if upstream is not None:  # before the relay can send: the leader waits for its rows from the first check
        upstream.join.remote(name)
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return FleetRelay.options(scheduling_strategy=strategy).remote(ledger, upstream, name)
