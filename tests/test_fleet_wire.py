"""The compact path of fleet facts: 49 bytes per rank per check, one message per group of nodes,
the parameter-group digests only when the head asks, and the same alarms as the facts sent whole.

A recorded fleet (made here: 16 ranks on 4 nodes, a rank slow in data loading, a replica changed
outside DDP in one parameter group, a NaN loss on one rank with a layer's non-finite gradient) is
replayed through the run ledger (head/ledger.py, in-process) twice: each rank's whole facts
(`fleet_facts`, the path before the relays), and each node's packed rows (`fleet_batch`, as a
node's relay sends them, node/fleet_relay.py) with the group digests sent when the answer asks
(`fleet_groups`). Once more through real Ray actors (the session's cluster): a run ledger and
four relays grouped under a leader, as a fit's ledger arranges them; the real relays also carry
every fit of the suite with fleet health on.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import numpy
import pytest

from ray_ormas import FleetSettings
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.fleet.wire import ROW, ROW_DTYPE, intro_of, pack, unpack
from ray_ormas._internal.head.fleet_head import FleetSpec
from ray_ormas._internal.head.ledger import Ledger
from ray_ormas._internal.record.store import RecordStore

WORLD, PER_NODE, CHECKS = 16, 4, 24
GROUP_NAMES = tuple((f"layer{i}.weight", f"layer{i}.bias") for i in range(8))


def recorded_fleet() -> list[list[RankFacts]]:
    """Per check, every rank's facts: rank 5 slow in data loading from check 4 to 12, rank 9's
    parameters differ in group 3 from check 14, rank 2's loss NaN at check 20 (layer1)."""
    rng = random.Random(7)
    out = []
    for check in range(CHECKS):
        row = []
        for rank in range(WORLD):
            odd = rank == 9 and check >= 14
            groups = tuple(f"{check:04x}{i:04x}" if not (odd and i == 3) else "ffffffff" for i in range(8))
            nan = rank == 2 and check == 20
            row.append(
                RankFacts(
                    rank=rank,
                    check=check,
                    step=10 * check,
                    world=WORLD,
                    node=f"10.0.0.{rank // PER_NODE}",
                    data_s=0.030 if rank == 5 and 4 <= check <= 12 else 0.001 + rng.random() * 0.0004,
                    forward_s=0.010 + rng.random() * 0.001,
                    wall_s=0.05,
                    timed_steps=5,
                    forwards=5,
                    loss=float("nan") if nan else 2.0 + rng.random(),
                    nonfinite_loss=nan,
                    nonfinite_layers=("layer1",) if nan else (),
                    digest=("%016x" % (check * 31 + (1 if odd else 0))),
                    groups=groups,
                    group_names=GROUP_NAMES if check <= 1 else None,
                )
            )
        out.append(row)
    return out


def ledger(tmp_path: Path, name: str) -> Ledger:
    settings = FleetSettings(ray_metrics=False)
    return Ledger(None, FleetSpec(settings, RecordStore.at(str(tmp_path / name)), "fit", "run", WORLD, "ddp"))


def alarms_of(summary) -> list[tuple]:
    return [
        (a["kind"], a.get("check"), tuple(a.get("ranks") or ()), a.get("slow_in"), a.get("layer"), a.get("source"))
        for a in summary.alarms
    ]


def relay_check(led: Ledger, row: list[RankFacts], send_groups: bool = True, tally: dict[str, int] | None = None):
    """One check through every node's relay path, as node/fleet_relay.py sends it: one
    `fleet_batch` per node, then its ranks' group digests if the answer asks (`tally`: the
    messages and bytes sent, counted)."""
    tally = {} if tally is None else tally

    async def relay(node: list[RankFacts]):
        packed = [pack(f) for f in node]
        rows = b"".join(r for r, _ in packed)
        extras = {f.rank: x for f, (_, x) in zip(node, packed) if x}
        intros = {f.rank: intro_of(f) for f in node if f.check == 0}
        tally["messages"] = tally.get("messages", 0) + 1
        tally["bytes"] = tally.get("bytes", 0) + len(rows) + sum(len(repr(x)) for x in extras.values())
        order, wanted = await led.fleet_batch("attempt-0", rows, extras, intros)
        if wanted and send_groups:  # held for a divergence: the digests that locate it, then the answer
            groups = {r: row[r].groups for r in wanted}
            tally["messages"] += 1
            tally["bytes"] += len(repr(groups))
            order = await led.fleet_groups("attempt-0", node[0].check, groups)
        return order

    return asyncio.gather(*(relay(row[first : first + PER_NODE]) for first in range(0, WORLD, PER_NODE)))


def test_a_ranks_facts_are_49_bytes_and_read_back_as_sent():
    facts = recorded_fleet()[20][2]
    row, extras = pack(facts)
    assert len(row) == ROW.size == ROW_DTYPE.itemsize == 49 and extras == {"layers": ("layer1",)}
    assert numpy.frombuffer(row, ROW_DTYPE)[0]["step"] == 200  # numpy reads the row as struct writes it
    back = unpack(row, intro_of(facts), extras)
    assert back.loss != back.loss and back.nonfinite_loss and back.digest == facts.digest
    assert (back.rank, back.check, back.step, back.node, back.world) == (2, 20, 200, "10.0.0.0", WORLD)
    assert abs(back.data_s - facts.data_s) < 1e-7 * facts.data_s and back.groups == ()
    plain = replace(facts, loss=None, digest="not hex", data_s=None, nonfinite_loss=False, nonfinite_layers=())
    row, extras = pack(plain)
    back = unpack(row, None, extras)
    assert (back.loss, back.digest, back.data_s, back.node) == (None, "not hex", None, None)


def whole_path_alarms(tmp_path: Path, fleet: list[list[RankFacts]]) -> list[tuple]:
    """The alarms of `fleet` sent whole, rank by rank (`fleet_facts`), as before the relays."""

    async def whole() -> list[tuple]:
        led = ledger(tmp_path, "whole")
        for row in fleet:
            for facts in row:
                await led.fleet_facts("attempt-0", facts)
        return alarms_of(await led.finish_fleet())

    return asyncio.run(whole())


def test_a_recorded_fleet_raises_the_same_alarms_through_the_relays_compact_path(tmp_path):
    fleet = recorded_fleet()

    async def compact() -> tuple[list[tuple], int, int, int]:
        led = ledger(tmp_path, "compact")
        tally: dict[str, int] = {}
        for row in fleet:
            await asyncio.wait_for(relay_check(led, row, tally=tally), 2)  # answered once complete
        return alarms_of(await led.finish_fleet()), tally["messages"], tally["bytes"], len(fleet) * WORLD

    expected = whole_path_alarms(tmp_path, fleet)
    got, messages, sent, rows = asyncio.run(compact())
    kinds = [a[0] for a in expected]
    assert kinds == ["straggler", "divergence", "straggler_recovered", "nonfinite"], expected
    assert ("divergence", 14, (9,), None, "one of layer3.weight ... layer3.bias", None) in expected  # group 3
    assert ("nonfinite", 20, (2,), None, "layer1", "loss") in expected
    assert ("straggler", 6, (5,), "data", None, None) in expected
    assert got == expected
    # One message per node per check, and one more from each of the two nodes that locate the divergence.
    assert messages == CHECKS * WORLD // PER_NODE + 2 and sent / rows <= 64, (messages, sent / rows)


def test_a_divergence_held_for_its_digests_is_alarmed_at_its_check_where_the_most_severe_alarm_acts(tmp_path):
    # At check 3, rank 9's parameters differ (held: the digests that locate it are on two nodes)
    # and rank 2's loss is NaN: the stop, the most severe, is the order every node's call answers.
    fleet = recorded_fleet()[:4]
    fleet[3] = [
        replace(f, digest="%016x" % 1, groups=("ee",) * 8) if f.rank == 9 else f
        for f in (replace(f, loss=float("nan"), nonfinite_loss=True) if f.rank == 2 else f for f in fleet[3])
    ]
    settings = FleetSettings(ray_metrics=False, actions={"divergence": "reattempt", "nonfinite": "stop"})
    led = Ledger(None, FleetSpec(settings, RecordStore.at(str(tmp_path / "acts")), "fit", "run", WORLD, "ddp"))

    async def run():
        answers = [await asyncio.wait_for(relay_check(led, row), 3) for row in fleet]
        return answers, await led.finish_fleet(stopped=True)

    answers, summary = asyncio.run(run())
    assert all(order is None for order in answers[2]) and {o.action for o in answers[3]} == {"stop"}, answers
    kinds = {a["kind"]: a for a in summary.alarms}
    assert kinds["divergence"]["check"] == kinds["nonfinite"]["check"] == 3
    assert kinds["divergence"]["layer"] == "one of layer0.weight ... layer0.bias"  # located: group 0 differs


def test_a_divergence_whose_digests_never_come_is_alarmed_unlocated_within_the_order_wait(tmp_path, monkeypatch):
    from ray_ormas._internal.head import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "ORDER_WAIT_S", 0.5)
    fleet = recorded_fleet()[12:16]  # rank 9 diverges from check 14
    led = ledger(tmp_path, "gone")

    async def run():
        for row in fleet:
            await asyncio.wait_for(relay_check(led, row, send_groups=False), 3)
        return await led.finish_fleet()

    summary = asyncio.run(run())
    (divergence,) = [a for a in summary.alarms if a["kind"] == "divergence"]
    assert divergence["check"] == 14 and divergence.get("layer") is None and "not located" in divergence["message"]


@pytest.mark.timeout(180)
def test_relay_actors_in_a_group_send_the_head_one_message_a_check_with_the_same_alarms(ray_cluster, tmp_path):
    # Real Ray actors: the run ledger and one relay per simulated node (4 nodes of 4 ranks), the
    # first leading the group as the ledger arranges them. The recorded fleet gives the same alarms
    # as each rank's whole facts, in one message to the head per check.
    import ray

    from ray_ormas._internal.head.ledger import RunLedger
    from ray_ormas._internal.node.fleet_relay import start_relay

    fleet = recorded_fleet()
    expected = whole_path_alarms(tmp_path, fleet)
    spec = FleetSpec(
        FleetSettings(ray_metrics=False), RecordStore.at(str(tmp_path / "actors")), "fit", "run", WORLD, "ddp"
    )
    led = RunLedger.options(num_cpus=0).remote(None, spec)
    node = ray.get_runtime_context().get_node_id()
    leader = start_relay(led, node, name="node0")
    relays = [leader, *(start_relay(led, node, leader, name=f"node{i}") for i in range(1, WORLD // PER_NODE))]

    def check(row: list[RankFacts], nodes: range = range(WORLD // PER_NODE)) -> list:
        calls = [
            relays[f.rank // PER_NODE].facts.remote("attempt-0", PER_NODE, f)
            for f in row
            if f.rank // PER_NODE in nodes
        ]
        return ray.get(calls, timeout=20)  # every rank answered: the check is complete

    try:
        ray.get([r.__ray_ready__.remote() for r in relays], timeout=60)  # as a rank uses its relay: once started
        for row in fleet:
            check(row)
        # The leader's node is lost: its members send to the ledger themselves; the lost node's
        # ranks are, here, sent whole.
        ray.kill(leader, no_restart=True)
        last = [replace(f, check=CHECKS, step=10 * CHECKS) for f in fleet[0]]
        late = [led.fleet_facts.remote("attempt-0", f) for f in last if f.rank < PER_NODE]
        check(last, range(1, WORLD // PER_NODE))
        ray.get(late, timeout=20)
        summary = ray.get(led.finish_fleet.remote(), timeout=60)
    finally:
        for actor in (*relays, led):
            ray.kill(actor, no_restart=True)
    assert alarms_of(summary)[: len(expected)] == expected
    # One message per check; at the divergence, the two ranks' digests (rank 0 on the leader's
    # node, rank 9 on the third) and one call for the order of the two nodes not asked; then the
    # three members, each on its own. (A loaded machine may split a check past the 1 s a leader
    # waits for its members: two such splits are let pass; without groups it would be 4 a check.)
    assert summary.checks == CHECKS + 1
    assert CHECKS + 3 + 3 <= summary.messages["relay_messages"] <= CHECKS + 3 + 3 + 2, summary.messages
    assert summary.messages["relay_rows"] == WORLD * CHECKS + 3 * PER_NODE, summary.messages
