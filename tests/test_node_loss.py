"""Losing the node that hosts the workers (rank 0 included) mid-run: the run completes on a fresh
node from its last checkpoint, and the record in storage is complete and linked. The scenarios
run one after the other on one simulated multi-node cluster in a subprocess
(tests/scenarios/node_loss.py): the fleet's `evict` action first (on nodes of its own,
tests/scenarios/evict.py: a slow node named and evicted, a policy that evicts, the bound, and
another job with a worker on the evicted node, tests/scenarios/bystander.py), then
node loss with local storage, with S3, and without a replacement node. The session's Ray cluster
is untouched; the subprocess runs beside the elastic scenario (tests/scenario_runs.py), and its
process group is killed if it hangs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pyarrow.compute as pc
import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run

from ray_ormas import open_records
from tests.scenario_runs import PHASE_TIMEOUT_S
from tests.scenarios.evict import SCREEN_FACTOR, SLOW_DATA_S

pytestmark = pytest.mark.system  # its own Ray head or cluster


@pytest.fixture(scope="module")
def lost_nodes(multi_node) -> tuple[Path, dict[str, str], str]:
    """The scenario's fits (tests/scenario_runs.py `NODE_LOSS_FITS`, run beside the elastic
    scenario): the folder of their outcomes, each fit's storage, the log."""
    run, base, storage = multi_node["node_loss"]
    return base, storage, run.wait()


def outcome_of(lost_nodes: tuple[Path, dict[str, str], str], name: str) -> tuple[dict, str, str]:
    base, storage, log = lost_nodes
    assert (base / f"{name}.json").is_file(), log[-4000:]
    return json.loads((base / f"{name}.json").read_text()), storage[name], log


@pytest.mark.timeout(PHASE_TIMEOUT_S)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_losing_the_workers_node_mid_run_ends_in_a_completed_run_and_complete_records(lost_nodes, where):
    outcome, storage, log = outcome_of(lost_nodes, where)
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    assert outcome["checkpoints_before_loss"] >= 1
    assert outcome["return_value"]["step"] == 5 * 8 and outcome["return_value"]["resumed_from_epoch"] is not None
    assert len(set(outcome["digests"])) == 1 and outcome["worker_errors"]

    records = open_records(f"{storage}/node-loss")
    first, second = records.segments()
    assert second.complete
    if where == "local":
        assert verify_run(second.path).ok
        assert outcome["not_uploaded"] == []
    else:
        # The lost node took its staging folder along (here the simulated node's folder is on this
        # machine, and removed by the test): the driver says which segment stays as last uploaded,
        # unless rank 0 closed and uploaded it when the other rank died first.
        assert len(outcome["not_uploaded"]) <= 1
        assert all("segment-000" in m and "its local copy is" in m for m in outcome["not_uploaded"])
    # The lost attempt's segment: cut off (no run_end), or closed by rank 0 with the error its
    # collective raised when the other rank died first; which one depends on who dies first.
    last = json.loads(records.events().filter(pc.equal(records.events()["segment"], 0))["line"][-1].as_py())
    assert not first.complete or "error" in last, last
    assert second.link["previous"]["segment"] == "segment-000" and second.link["attempt"] == 1
    resumed_step = second.link["step_offset"]
    assert resumed_step == 8 * (outcome["return_value"]["resumed_from_epoch"] + 1)
    metrics = records.metrics()
    by_segment = list(zip(metrics.column("segment").to_pylist(), metrics.column("run_step").to_pylist()))
    lost = [step for segment, step in by_segment if segment == 0]
    assert set(range(0, resumed_step, 3)) <= set(lost)  # nothing up to the checkpoint is missing
    assert [step for segment, step in by_segment if segment == 1] == list(range(resumed_step, 40, 3))


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_without_a_replacement_node_the_wait_is_bounded_by_the_controller_failure_limit(lost_nodes):
    outcome, storage, log = outcome_of(lost_nodes, "bounded")
    assert outcome["finished"], log[-4000:]
    assert outcome["error"].startswith("ControllerError") and "worker group startup timed out" in outcome["error"]
    assert outcome["seconds_after_loss"] < 120
    records = open_records(f"{storage}/node-loss")
    first = records.segments()[0]  # the lost node's record is in storage
    last = json.loads(records.events()["line"][-1].as_py())
    assert first.events > 0 and (not first.complete or "error" in last), last  # cut off, or closed with the error


# ------------------------------------------------------------------ the fleet's `evict` action
def attempts_nodes(outcome: dict) -> list[dict[int, str]]:
    """rank -> node id of each attempt, from the files the ranks wrote when they started."""
    starts = sorted(outcome["starts"].items())  # by start time: two ranks per attempt
    return [{int(name.split("-rank")[1]): node for name, node in starts[i : i + 2]} for i in range(0, len(starts), 2)]


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_slow_node_is_named_within_three_checks_then_evicted_and_the_group_restarts_without_it(
    lost_nodes, capsys, tmp_path
):
    outcome, storage, log = outcome_of(lost_nodes, "evict")
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    a, c, d = outcome["nodes"]["A"], outcome["nodes"]["C"], outcome["nodes"]["D"]
    first, second, third = attempts_nodes(outcome)
    slow = next(rank for rank, node in first.items() if node == a)  # the rank on the slow node
    fast = 1 - slow

    # The fleet record, read back as a user would: every rank at every check of every attempt.
    records = open_records(f"{storage}/evict")
    checks = records.fleet_checks().to_pylist()
    seen = [  # what each check of attempt 0 saw, for a failure's message
        {k: c[k] for k in ("step", "rank", "data_s", "forward_s", "wall_s", "relative_score", "slow")}
        for c in checks
        if c["attempt"] == 0
    ]
    # Named within three checks. Checks at steps 0, 5, 10, ...; each carries the median timings
    # of the 5 steps up to it, so a straggler is seen at the first check whose steps it slows in
    # the majority: from step 18, the check at step 20 (steps 18, 19, 20 of 16-20).
    stragglers = [x for x in outcome["alarms"] if x["kind"] == "straggler"]  # none after the eviction
    assert len(stragglers) == 1, (stragglers, outcome["actions"], seen)
    [alarm] = stragglers
    assert alarm["attempt"] == 0 and alarm["ranks"] == [slow] and alarm["slow_in"] == "data"
    assert 20 <= alarm["step"] <= 20 + 2 * 5, (alarm, seen)  # the 1st, 2nd or 3rd slow check
    assert f"rank {slow} on node" in alarm["message"] and "data loading" in alarm["message"]
    ranks = outcome["ranks"]
    assert alarm["node"] == ranks[slow]["node"] and ranks[slow]["lowest_score"] < 0.5
    assert outcome["checks"] >= 12 and "rank  node" in outcome["table"]

    assert len(checks) == 2 * outcome["checks"] and {c["rank"] for c in checks} == {0, 1}
    slow_rows = [c for c in checks if c["attempt"] == 0 and c["step"] >= 20]
    data = {r: statistics.median(c["data_s"] for c in slow_rows if c["rank"] == r) for r in (0, 1)}
    assert data[slow] >= SLOW_DATA_S > 0.02 > data[fast], data
    first_attempt = [c for c in checks if c["attempt"] == 0 and c["relative_score"] is not None]
    scores = {r: [c["relative_score"] for c in first_attempt if c["rank"] == r] for r in (0, 1)}
    slowed = {r: [c["relative_score"] for c in first_attempt if c["rank"] == r and c["step"] >= 20] for r in (0, 1)}
    # The other rank may be slow at a single check on a busy machine (at its first scored check,
    # while the processes warm up, it scored 0.05 once), but never for the 3 checks in a row an
    # alarm takes (one alarm, above). Once node A is slowed, the slow node's rank is below half
    # its peer's speed at most checks, and the other rank is not.
    assert statistics.median(scores[fast]) >= 0.5, scores
    assert statistics.median(slowed[slow]) < 0.5 <= statistics.median(slowed[fast]), slowed
    paths = records.write_parquet(Path(storage) / "parquet")
    tables = ("fleet_checks", "fleet_alarms", "fleet_attempts", "fleet_actions", "fleet_preflight")
    assert all(paths[t].is_file() for t in tables)

    # The eviction: node A kept out of the run (not drained), the group restarted on two of B and
    # the spares C and D, from Ray's latest checkpoint; the record's attempts say so.
    evict = outcome["actions"][0]
    assert (evict["alarm"], evict["action"], evict["outcome"]) == ("straggler", "evict", "done"), evict
    assert evict["evicted_ids"] == [a] and evict["why"].startswith("Ray's latest checkpoint at the alarm")
    assert 0 < evict["seconds"] < 120
    assert set(first.values()) == {a, outcome["nodes"]["B"]}
    assert a not in second.values() and set(second.values()) <= {outcome["nodes"]["B"], c, d}
    assert evict["scope"] == "run" and outcome["alive"][a] is True
    # Nothing told Ray's GCS: no drain for Ray Train's PreemptionWatcher to see in another run on
    # node A, and new work is still placed there.
    assert outcome["draining"] == [] and outcome["ran_on_a"] == a
    attempts = records.fleet_attempts().to_pylist()
    assert [(x["event"], x["world_size"]) for x in attempts] == [("start", 2), ("restart", 2), ("restart", 2)]
    # Ray's latest checkpoint when the group restarted (it may be later than at the alarm).
    assert attempts[1]["run_step"] == evict["resumed_run_step"] >= evict["checkpoint_run_step"]
    # ... and the action's record names the checkpoint the group resumed from: the one attempt 1's
    # rank 0 loaded, as its record's segment says.
    loaded = records.segments()[1].link["resumed_from"]["checkpoint"]
    assert evict["resumed_from"] == loaded, (evict, loaded)

    # MLflow (the default embedded store): the slow rank's scores, the alarm and the action.
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(storage) / 'evict' / 'mlflow' / 'mlflow.db'}")
    run_id = outcome["mlflow_run_id"]
    scores = {m.step: m.value for m in client.get_metric_history(run_id, f"fleet/rank_{slow}/score")}
    assert min(scores.values()) < 0.5 and max(scores) == 70
    [logged] = client.get_metric_history(run_id, "fleet/alarms/straggler")
    assert logged.step == alarm["run_step"]
    assert [m.step for m in client.get_metric_history(run_id, "fleet/actions/straggler")] == [alarm["run_step"]]

    # `ray-ormas report`, as a user reads the run.
    from ray_ormas._internal.cli.main import main

    assert main(["report", f"{storage}/evict", "--out", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out
    said = f"action: evict after the straggler alarm on ranks {slow} at run step {alarm['run_step']}: done"
    assert said in out and f"node {ranks[slow]['node']} kept out of this run" in out, out
    assert "action: log after the policy alarm on ranks 1" in out and ": bounded" in out


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_node_slow_for_real_and_a_probe_that_fails_on_another_are_named_before_the_first_step(lost_nodes):
    # tests/scenarios/evict.py: before attempt 0's first step, node A's workers ran under a CPU
    # quota (a fifth of a CPU) and the screen's own probe failed on node B. The screen's
    # action is `log`: the fit trained on (the straggler and the evicts that follow are the other tests').
    outcome, _, log = outcome_of(lost_nodes, "evict")
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    a, b = outcome["nodes"]["A"], outcome["nodes"]["B"]
    first, *later = outcome["preflight"]
    rows = {r["node_id"]: r for r in first["rows"]}
    assert first["attempt"] == 0 and set(rows) == {a, b} and first["note"] is None, first
    slow, broken = rows[a], rows[b]
    # named against its peer's median, at the scenario's factor
    assert slow["slow"] and slow["compute_s"] > SCREEN_FACTOR * slow["compute_peers_s"], slow
    assert slow["why"].startswith("its matmul took") and slow["broken"] == {}, slow
    probe = "tests.loops:FailOnNode"
    assert list(broken["broken"]) == [probe] and "not mounted" in broken["broken"][probe], broken
    assert slow["facts"] == {probe: {"storage": "readable"}}
    [alarm] = [x for x in outcome["alarms"] if x["kind"] == "preflight" and x["attempt"] == 0]
    assert sorted(alarm["ranks"]) == [0, 1] and alarm.get("run_step") is None
    assert f"({a[:8]}): its matmul took" in alarm["message"], alarm
    assert f"({b[:8]}): {probe} is broken (OSError" in alarm["message"], alarm
    assert first["named"] == sorted(alarm["ranks"]) and not first["clean"]
    # Every attempt was screened; node A is in none of the later ones, and B's probe fails where B is.
    assert [s["attempt"] for s in outcome["preflight"]] == [0, 1, 2]
    for screen in later:
        nodes = {r["node_id"]: r for r in screen["rows"]}
        assert a not in nodes and (b not in nodes or nodes[b]["broken"]), screen


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_policy_evicts_on_its_own_rule_until_max_actions_then_only_logs(lost_nodes):
    outcome, storage, log = outcome_of(lost_nodes, "evict")
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    _, second, third = attempts_nodes(outcome)
    policy = [x for x in outcome["actions"] if x["alarm"] == "policy"]
    # Attempt 1: the policy's evict keeps rank 1's node out too; attempt 2 runs on the two left.
    evicted = policy[0]
    assert (evicted["attempt"], evicted["action"], evicted["outcome"], evicted["ranks"]) == (1, "evict", "done", [1]), (
        outcome["actions"]
    )
    assert evicted["evicted_ids"] == [second[1]] and second[1] not in third.values()
    spares = {outcome["nodes"][name] for name in "BCD"}
    assert set(third.values()) == spares - {second[1]}, (second, third)  # never A, nor rank 1's node
    # Attempt 2: the same fault comes back; max_actions=2 was reached: it only logs, and says why.
    bounded = policy[1]
    assert (bounded["attempt"], bounded["action"], bounded["outcome"]) == (2, "log", "bounded"), bounded
    assert bounded["reason"] == "max_actions (2) already taken in this fit: only logged"
    assert len(outcome["actions"]) == 3
    # ... and the run went on to its end: one segment per attempt, the last complete.
    segments = open_records(f"{storage}/evict").segments()
    assert [s.attempt for s in segments] == [0, 1, 2] and segments[-1].complete and segments[-1].loop_ended


def the_other_job(outcome: dict) -> tuple[dict, list[dict], dict[int, list[str]]]:
    """The other job beside the evicting fit (tests/scenarios/bystander.py): its outcome, what each
    rank saw (rank order), and the nodes each rank's loop started on (one entry per start)."""
    other = outcome["bystander"]
    ranks_dir = Path(other["ranks_dir"])
    seen = [json.loads((ranks_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    starts: dict[int, list[str]] = {}
    for start in sorted(ranks_dir.glob("start-rank*")):
        starts.setdefault(int(start.name.split("-rank")[1].split("-")[0]), []).append(start.read_text())
    return other, seen, starts


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_another_job_with_a_worker_on_the_evicted_node_trains_to_its_end_untouched(lost_nodes):
    # The run-scoped evict kept node A out of the evicting fit's later worker groups and told
    # nothing else: the other job, one rank on A (and one on B, which the policy evicts later),
    # waited on A until the evicting fit's attempt 1 had started elsewhere, then trained to its
    # end. Not restarted, not preempted: each rank's loop started once, one record segment, no
    # worker error; Ray's GCS drained nothing.
    outcome, storage, log = outcome_of(lost_nodes, "evict")
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    other, seen, starts = the_other_job(outcome)
    assert other["error"] is None, other
    a = outcome["nodes"]["A"]
    assert outcome["actions"][0].get("evicted_ids") == [a], outcome["actions"]
    assert {r: len(s) for r, s in starts.items()} == {0: 1, 1: 1}, starts  # never restarted
    assert a in {s["node"] for s in seen} and {s["node"] for s in seen} == {a, outcome["nodes"]["B"]}
    assert all(s["released"] and s["held_s"] > 1 for s in seen), seen  # it trained on after the evict
    assert other["worker_errors"] == [] and outcome["draining"] == []
    segments = open_records(f"{storage}/bystander").segments()
    assert len(segments) == 1 and segments[0].complete and segments[0].loop_ended


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_gradient_accumulation_is_one_monitor_step_per_optimizer_step(lost_nodes):
    # DDP with 4 micro-batches per optimizer step, on the other job beside the evicting fit (its
    # subject is the same on any cluster; the fit is shared, as docs/contributing.md says).
    outcome, _, log = outcome_of(lost_nodes, "evict")
    other, seen, _ = the_other_job(outcome)
    assert other["error"] is None, (other, log[-4000:])
    for s in seen:
        assert s["per_rank_batch"] == 8  # 64 / (2 ranks x 4 micro-batches)
        assert s["optimizer_steps"] == s["monitor_steps"] == 6
    # The micro-steps skipped the all-reduce (ranks differ), the last one did not (ranks agree).
    assert seen[0]["grad_after_micro"] != seen[1]["grad_after_micro"]
    assert seen[0]["grad_after_sync"] == seen[1]["grad_after_sync"]
    # The recorded loss is rank 0's mean over the window of the optimizer step.
    record = Path(other["record_dir"])
    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    recorded = [r["loss"] for r in rows]
    assert [r["step"] for r in rows] == [0, 2, 4]
    for got, want in zip(recorded, [seen[0]["window_means"][i] for i in (0, 2, 4)]):
        assert math.isclose(got, want, rel_tol=1e-6)
    diary = [json.loads(line) for line in (record / "diary.jsonl").read_text().splitlines()]
    assert diary[-1]["steps"] == 6
    link = json.loads((record / "segment.json").read_text())
    assert link["batch"] == {"size": 64, "per": "global", "accumulation": 4, "per_rank": 8, "effective": 64}
    assert other["final"]["ormas/effective_batch"] == 64
