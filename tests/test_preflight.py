"""The pre-flight screen's parts that need no cluster: the verdict's arithmetic (fleet/preflight.py),
the settings, the pairs of the link probe and the compute probe's known answer (worker/preflight.py).

The screen on real Ray: the healthy shared fit screens clean (tests/test_fleet.py), and on the
simulated multi-node cluster a node made slow with a CPU quota and a probe that raises on another
node are named before the first step (tests/test_node_loss.py).
"""

from __future__ import annotations

import time

import pytest
import torch

from ray_ormas import FleetSettings, PreflightSettings
from ray_ormas._internal.fleet.preflight import ProbeResult, judge
from ray_ormas._internal.worker.preflight import _facts_of, _partner, compute_probe
from ray_ormas.errors import OptionError


def result(rank: int, node: str, compute_s: float = 0.01, link_s: float | None = 0.002, **more) -> ProbeResult:
    return ProbeResult(rank=rank, node=f"10.0.0.{node}", node_id=node * 8, compute_s=compute_s, link_s=link_s, **more)


def test_a_rank_slower_than_twice_its_peers_on_other_nodes_is_named_with_its_node_and_both_numbers():
    results = [result(0, "a"), result(1, "b"), result(2, "c", compute_s=0.05), result(3, "d")]
    verdict = judge(0, results, PreflightSettings(), [])
    assert [r["rank"] for r in verdict.rows if r["slow"]] == [2]
    alarm = verdict.alarm
    assert alarm is not None and alarm.kind == "preflight" and alarm.ranks == (2,)
    assert alarm.node == "10.0.0.c (cccccccc)"
    assert "rank 2 on node 10.0.0.c (cccccccc): its matmul took 50 ms, the median on other nodes 10 ms" in alarm.message
    assert verdict.summary()["named"] == [2] and not verdict.summary()["clean"]
    # 2x is the default factor: 1.9x is not slow; a factor of 6 lets 5x through.
    assert judge(0, [*results[:2], result(2, "c", compute_s=0.019)], PreflightSettings(), []).alarm is None
    assert judge(0, results, PreflightSettings(factor=6), []).alarm is None


def test_a_slow_link_is_named_and_a_rank_is_compared_only_with_other_nodes():
    # Ranks 0 and 1 share node a: rank 1 is compared with b and c only.
    results = [result(0, "a"), result(1, "a", link_s=0.02), result(2, "b"), result(3, "c")]
    verdict = judge(0, results, PreflightSettings(), [])
    assert [r["rank"] for r in verdict.rows if r["slow"]] == [1]
    assert "its exchange took 20 ms, the median on other nodes 2 ms" in verdict.rows[1]["why"]
    assert verdict.rows[1]["link_peers_s"] == pytest.approx(0.002)


def test_one_rank_or_one_node_has_nothing_to_compare_and_says_so():
    one = judge(0, [result(0, "a", compute_s=9.0)], PreflightSettings(), [])
    assert one.alarm is None and one.note == "one rank: nothing to compare against"
    same = judge(0, [result(0, "a", compute_s=9.0), result(1, "a")], PreflightSettings(), [])
    assert same.alarm is None and same.note == "every rank runs on one node: nothing to compare against"


def test_floors_broken_probes_and_missing_ranks_are_named():
    results = [
        result(0, "a", flops=5e9, bytes_per_s=1e8),
        result(1, "b", flops=5e11, bytes_per_s=1e8, broken={"mypkg:read_storage": "OSError: no route"}),
    ]
    settings = PreflightSettings(min_flops=1e10, min_bytes_per_s=5e8)
    verdict = judge(3, results, settings, missing=[2])
    by_rank = {r["rank"]: r for r in verdict.rows}
    assert "its matmul ran at 5 GFLOP/s, below the floor of 10" in by_rank[0]["why"]
    assert "the all-reduce moved 100 MB/s, below the floor of 500" in by_rank[1]["why"]
    assert by_rank[1]["broken"] == {"mypkg:read_storage": "OSError: no route"}
    assert by_rank[2]["broken"] == {"screen": "no result within the screen's timeout_s (120 s)"}
    assert verdict.alarm is not None and verdict.alarm.ranks == (0, 1, 2) and verdict.alarm.attempt == 3
    assert "mypkg:read_storage is broken (OSError: no route)" in verdict.alarm.message


def test_the_settings_are_checked_on_the_driver_and_take_yaml_forms():
    assert FleetSettings().preflight == PreflightSettings()
    assert FleetSettings(preflight=False).preflight.enabled is False
    assert FleetSettings(preflight={"factor": 3}).preflight.factor == 3.0
    assert FleetSettings(actions={"preflight": "evict"}).action_for("preflight") == ("evict",)
    with pytest.raises(OptionError, match="PreflightSettings.factor: Input should be greater than 1"):
        PreflightSettings(factor=1)
    with pytest.raises(OptionError, match="cannot import 'nope:probe'"):
        PreflightSettings(probes=["nope:probe"])
    assert PreflightSettings(probes=["time:monotonic"]).to_dict()["probes"] == ["time:monotonic"]
    # Two probes of one name (two lambdas, two instances of one class) would share one entry in
    # the record, a failure of one hidden by the other's facts: refused on the driver.
    with pytest.raises(OptionError, match=r"two probes are named 'tests.test_preflight:.*<lambda>'"):
        PreflightSettings(probes=[lambda: {"a": 1}, lambda: {"b": 2}])
    with pytest.raises(OptionError, match="two probes are named 'time:monotonic'"):
        PreflightSettings(probes=["time:monotonic", "time:monotonic"])
    assert PreflightSettings().matmul_side(on_gpu=False) == 512 and PreflightSettings().matmul_side(on_gpu=True) == 4096


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_the_link_probe_pairs_every_rank_with_a_partner_who_pairs_back(world):
    for shift in (0, 1):
        partners = {rank: _partner(rank, world, shift) for rank in range(world)}
        for rank, partner in partners.items():
            assert partner is None or partners[partner] == rank, (shift, partners)
    # Every rank has a partner in at least one round, and in two rounds when there are more than two ranks
    # and the count is even, so a rank paired with a slow one has another time.
    for rank in range(world):
        rounds = [p for p in (_partner(rank, world, 0), _partner(rank, world, 1)) if p is not None]
        assert rounds, rank
        if world % 2 == 0 and world > 2:
            assert len(set(rounds)) == 2, (rank, rounds)


def test_the_compute_probe_checks_its_product_against_the_known_answer():
    seconds, flops = compute_probe(64, 3, torch.device("cpu"))
    assert seconds > 0 and flops > 0


def test_a_user_probe_that_hangs_is_broken_at_the_timeout_and_one_that_returns_other_than_a_dict_too():
    with pytest.raises(TimeoutError, match="did not return within the screen's timeout_s"):
        _facts_of(lambda: time.sleep(5), timeout_s=0.2)
    with pytest.raises(TypeError, match="returns a dict of named facts, got list"):
        _facts_of(lambda: [1], timeout_s=5)
    assert _facts_of(lambda: {"read_ms": 1.5, "path": object()}, timeout_s=5)["read_ms"] == 1.5
