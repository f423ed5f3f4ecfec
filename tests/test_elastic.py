"""Elastic fits (`ScalingConfig(num_workers=(min, max))`) through a real resize, and their bad input.

The resizes run on their own simulated multi-node cluster in a subprocess (tests/scenarios/elastic.py),
one fit per strategy, one after the other: 2 workers, a node lost (DDP: the fleet's policy takes
rank 1's stacks and evicts its node; FSDP: the node is removed), so Ray restarts the group at 1;
a node added (Ray grows it back to 2). The DDP fit's policy then restarts the grown group, whose
pre-flight screen stops the fit before its first step (a probe fails on rank 1, and the
`preflight` alarm's action is `stop`); the FSDP fit's policy restarts the grown group once
(`reattempt`), and the fit returns. It runs beside the node-loss scenario
(tests/scenario_runs.py); its process group is killed if it hangs.
The bad-input tests need no Ray cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import ScalingConfig

from ray_ormas import BatchSize, RayOrmasTrainer, open_records

from .loops import elastic_loop
from .scenario_runs import PHASE_TIMEOUT_S, STRATEGIES


@pytest.fixture(scope="module")
def resized(multi_node) -> tuple[Path, str]:
    """Both strategies' elastic fits, one after the other on one simulated cluster
    (tests/scenarios/elastic.py, run beside the node-loss scenario: tests/scenario_runs.py): the
    folder of their outcomes and storage, and the scenario's log."""
    run, base, _ = multi_node["elastic"]
    return base, run.wait()


@pytest.mark.system  # its own Ray cluster
@pytest.mark.timeout(PHASE_TIMEOUT_S)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_elastic_fit_shrinks_and_grows_with_one_segment_per_size_and_one_mlflow_run(resized, strategy):
    base, log = resized
    assert (base / f"{strategy}.json").is_file(), log[-4000:]
    outcome, storage = json.loads((base / f"{strategy}.json").read_text()), base / "runs" / strategy
    assert "error" not in outcome and outcome["finished"], (outcome, log[-4000:])
    # The DDP fit's policy restarts the grown group, whose screen stops the fit before its first
    # step: that attempt (3) has no segment. The FSDP fit's restarted group trains and returns.
    stopped = strategy == "ddp"
    worlds = [2, 1, 2] if stopped else [2, 1, 2, 2]  # the segments' world sizes
    if stopped:  # a RayOrmasError naming the rank, its node and what its probe said
        said = outcome["stopped"]
        assert said.startswith("stopped by the fleet's preflight alarm (rank 1 on node "), said
        assert "before the first step): the screen of attempt 3: rank 1 on node" in said, said
        assert "tests.loops:StorageLostOnRank is broken (OSError: the run's storage is not mounted" in said, said
    else:  # the grown attempt trained 2 epochs of 8 steps at 32 samples per rank (the global 64 split)
        assert outcome["return_value"]["world"] == 2 and outcome["return_value"]["per_rank_batch"] == 32

    # The record: one linked segment per attempt, each with its world size and its batch split; the
    # run step continues across sizes, and every segment that was closed verifies.
    records = open_records(storage / "elastic")
    segments = records.segments()
    assert [s.link["world_size"] for s in segments] == worlds, [s.link for s in segments]
    assert [s.link["batch"]["per_rank"] for s in segments] == [64 // w for w in worlds]
    assert {s.link["batch"]["effective"] for s in segments} == {64}
    assert [s.link["attempt"] for s in segments] == list(range(len(worlds)))
    offsets = [s.step_offset for s in segments]
    assert offsets[0] == 0 and all(o % 8 == 0 for o in offsets) and offsets[2] > offsets[1], offsets
    assert [s.link["previous"]["segment"] for s in segments[1:]] == [f"segment-00{i}" for i in range(len(worlds) - 1)]
    assert segments[-1].complete and segments[1].complete is not None
    assert ("FleetReattemptError" in str(segments[-1].error)) == stopped, segments[-1].error  # the policy's restart
    for seg in segments:
        if seg.complete:
            assert verify_run(seg.path).ok, seg.path
    if not stopped:
        assert outcome["final"]["ormas/segments"] == 4 and outcome["final"]["ormas/run_step"] == offsets[3] + 16
        assert offsets[3] > offsets[2]  # the restart resumed from a checkpoint of the grown attempt

    # The fleet: the resizes are events in its record, not alarms; each check compares the ranks
    # of its own attempt (an attempt at 1 worker has nothing to compare).
    attempts = records.fleet_attempts().to_pylist()
    assert [(a["event"], a["world_size"], a.get("resized_from")) for a in attempts] == [
        ("start", 2, None),
        ("resize", 1, 2),
        ("resize", 2, 1),
        *([] if stopped else [("restart", 2, None)]),
    ]
    assert [a["run_step"] for a in attempts] == offsets
    # Actions were configured (divergence: reattempt, nonfinite: stop) and none of them fired:
    # each rank of every size read the head's answer at every check.
    # The pre-flight screen ran before every attempt's first step (4 in each fit: the DDP fit's
    # last one screened out), the 1-worker one too (which had nothing to compare against, and says
    # so). A slow name is not checked: on this cluster, beside the node-loss scenario on 2 cores, a
    # rank's matmul may be named slow at a start (the FSDP fit's alarms log; the DDP fit's, which
    # stop, have a factor of 10).
    screens = records.fleet_preflight().to_pylist()
    assert sorted({r["attempt"] for r in screens}) == list(range(4)), screens
    assert [r["note"] for r in screens if r["attempt"] == 1] == ["one rank: nothing to compare against"], screens
    assert all(r["compute_s"] > 0 for r in screens), screens
    broken = [(r["attempt"], r["rank"]) for r in screens if r["broken"] != "{}"]
    assert broken == ([(3, 1)] if stopped else []), screens
    alarms = [a for a in records.fleet_alarms().to_pylist() if a["kind"] != "preflight"]
    actions = [json.loads(line) for line in records.fleet_actions().column("line").to_pylist()]
    if not stopped:  # the node was removed (no alarm); the policy's restart, at the same size
        assert [(a["kind"], a["attempt"], a["ranks"]) for a in alarms] == [("policy", 2, [0])]
        [restart] = actions
        assert (restart["action"], restart["outcome"], restart["attempt"]) == ("reattempt", "done", 2), restart
        assert restart["resumed_run_step"] == offsets[3] and 0 < restart["seconds"] < 120
    else:  # the policy's evict, then its restart, then the screen's stop
        assert [(a["kind"], a["attempt"], a["ranks"]) for a in alarms] == [("policy", 0, [1]), ("policy", 2, [0])]
        evict, restart, stop = actions
        # The evict: the group came back smaller, on the node left.
        assert (evict["action"], evict["diagnose"], evict["outcome"]) == ("evict", True, "done"), evict
        assert evict["evicted_ids"] == outcome["evicted"] and len(outcome["evicted"]) == 1, (evict, outcome)
        assert evict["resumed_run_step"] == offsets[1] and evict["run_step"] >= 24
        # The stacks were taken on rank 1's own node (a worker node, not the head), in the loop.
        assert "elastic_loop" in evict["stacks"]["1"], evict["stacks"]
        assert 0 < evict["seconds"] < 120
        # The restart was carried out (the group started again), though it trained nothing.
        assert (restart["action"], restart["attempt"], restart["outcome"]) == ("reattempt", 2, "done"), restart
        assert restart["reason"].endswith("its pre-flight screen ended it before its first step"), restart
        # The stop, before attempt 3's first step: Ray did not retry it (max_failures=3 allowed more).
        assert (stop["alarm"], stop["action"], stop["attempt"], stop["outcome"]) == ("preflight", "stop", 3, "done")
        assert stop.get("run_step") is None, stop
    checks = records.fleet_checks()
    ranks_per_check: dict = {}
    digests: dict = {}
    for row in checks.to_pylist():
        ranks_per_check.setdefault((row["attempt"], row["check"]), set()).add(row["rank"])
        digests.setdefault((row["attempt"], row["check"]), set()).add(row["digest"])
    assert {a for a, _ in ranks_per_check} == set(range(len(worlds)))
    assert all(ranks == ({0} if a == 1 else {0, 1}) for (a, _), ranks in ranks_per_check.items())
    if strategy == "ddp":  # replicas: equal within each attempt's check (FSDP shards differ by design)
        assert all(len(d) == 1 for d in digests.values()), digests
    table = records.fleet_attempts()
    assert table.filter(pc.equal(table["event"], "resize")).num_rows == 2

    # MLflow: one run for the whole fit (FINISHED, or FAILED by the stop), with the world size at
    # each attempt's first step.
    client = MlflowClient(outcome.get("tracking_uri") or f"sqlite:///{storage / 'elastic' / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("ray-ormas").experiment_id])
    assert run.info.status == ("FAILED" if stopped else "FINISHED")
    assert run.info.run_id == outcome.get("mlflow_run_id", run.info.run_id)
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "ormas/world_size"))
    assert history == [(o, float(w)) for o, w in zip(offsets, worlds)]
    assert run.data.params["scaling.num_workers"] == "[1, 2]"

    # Goodput: each restart at another size is counted as an elastic resize (the failure or the
    # evict that led to it kept as its `error`); the FSDP fit's policy restart at the same size is
    # counted under its alarm and action.
    (account,) = records.goodput_per_fit()
    assert [r.cause for r in account.restarts] == ["elastic resize"] * 2 + ["policy reattempt"]
    assert [a.world for a in account.attempts] == [2, 1, 2, 2]  # the DDP fit's last attempt too, screened out
    assert sum(account.buckets.values()) == pytest.approx(account.wall_s) and account.restart_by_cause


def elastic(num_workers, **kwargs):
    return RayOrmasTrainer(elastic_loop, scaling_config=ScalingConfig(num_workers=num_workers), mlflow=False, **kwargs)


@pytest.mark.parametrize(
    "num_workers, says",
    [
        ((0, 4), "starts below 1 worker"),
        ((4, 2), "must be <= max_workers"),  # Ray's own ScalingConfig refuses it, naming num_workers
    ],
)
def test_a_bad_elastic_range_is_refused_on_the_driver(num_workers, says):
    with pytest.raises(ValueError, match="num_workers") as e:
        elastic(num_workers)
    assert says in str(e.value)


def test_a_range_changed_after_the_scaling_config_was_built_is_refused_too():
    scaling = ScalingConfig(num_workers=(2, 4))
    scaling.num_workers = (4, 2)
    with pytest.raises(ValueError, match=r"ScalingConfig\(num_workers=...\): the elastic range \[4, 2\]"):
        RayOrmasTrainer(elastic_loop, scaling_config=scaling, mlflow=False)


def test_a_global_batch_no_size_of_the_range_can_split_is_refused_on_the_driver():
    with pytest.raises(ValueError, match=r"splits evenly at no world size of ScalingConfig\(num_workers=...\)"):
        elastic((2, 4), batch=BatchSize(5, per="global"))
    with pytest.raises(ValueError, match="gives no sample to each rank at 4 workers"):
        elastic((1, 4), batch=BatchSize(3, per="global"))


def test_a_global_batch_some_sizes_cannot_split_is_rounded_down_there_and_said(caplog):
    trainer = elastic((1, 4), batch=BatchSize(64, per="global"))
    assert {w: (s["per_rank"], s["effective"], s["rounded"]) for w, s in trainer.batches.items()} == {
        1: (64, 64, False),
        2: (32, 64, False),
        3: (21, 63, True),
        4: (16, 64, False),
    }
    assert "does not split evenly at 3 workers" in caplog.text and "sees 63 samples" in caplog.text
    per_rank = elastic((1, 3), batch=BatchSize(16, per="rank")).batches
    assert {w: s["effective"] for w, s in per_rank.items()} == {1: 16, 2: 32, 3: 48}


def test_the_end_of_run_summary_names_each_resize_apart_from_the_alarms(tmp_path):
    from pyarrow.fs import LocalFileSystem

    from ray_ormas import RecordStore
    from ray_ormas._internal.cli.summary import render
    from ray_ormas._internal.record.fleet_record import FleetSummary

    attempts = [
        {"attempt": 0, "world_size": 2, "run_step": 0, "event": "start"},
        {"attempt": 1, "world_size": 1, "run_step": 8, "event": "resize", "resized_from": 2},
        {"attempt": 2, "world_size": 1, "run_step": 16, "event": "restart"},
    ]
    fleet = FleetSummary(record="runs/x/ormas/fleet/f", ranks=[], attempts=attempts)
    assert fleet.resizes == [attempts[1]]
    text = render(RecordStore(LocalFileSystem(), str(tmp_path)), {}, None, fleet)
    assert "  resized at run step 8: 2 -> 1 ranks" in text.splitlines()
    assert "alarm" not in text.replace("0 alarms", "")
