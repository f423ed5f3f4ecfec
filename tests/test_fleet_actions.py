"""When the fleet acts: alarms that restart the worker group, capture stacks or stop the fit.

One fit on a simulated multi-node cluster (tests/scenarios/acts.py, run by the elastic scenario
on its cluster after the elastic fits, beside the node-loss scenario: tests/scenario_runs.py),
its two ranks on two worker nodes of three, as the one trial of a Ray Tune sweep, carries five
faults, one per attempt, each injected by the test's loop (tests/loops.py), its pre-flight probe
or its policy, never by a switch in the package:

    attempt 0   rank 1 changes its weights outside DDP after step 22: `divergence` at run step 25
                -> reattempt, from the checkpoint at run step 20 (not Ray's latest, 30, taken
                   after the replicas stopped agreeing)
    attempt 1   rank 1 blocks forever before step 32's backward: `hang` after hang_after_s
                -> diagnose (py-spy on rank 1's node: the stuck rank's stack), then reattempt
                   (its worker is ended)
    attempt 2   rank 1 raises Ray's NCCLHangError at step 34: a worker failure, `nccl_hang`
                (no action: Ray's own failure policy restarts the group)
    attempt 3   the test's pre-flight probe fails on rank 1 before the first step: its node is
                evicted (kept out of the run), the group restarts on the spare
    attempt 4   rank 1's loss is NaN at step 45: `nonfinite` -> stop: `FleetStopError`, which
                neither Ray nor Tune retries (max_failures would allow one more restart)

The tests below read that one fit; the rules themselves (the bound, the choice of checkpoint,
the settings' checks) are also checked without Ray, and a policy and a diagnose that only logs
on the session's shared busy fit, with Ray's exported metrics.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import FailureConfig, RunConfig, ScalingConfig

import ray_ormas
from ray_ormas import FleetSettings, RayOrmasTrainer
from ray_ormas._internal.common.fleet_records import FleetAlarm
from ray_ormas._internal.common.options import build
from ray_ormas._internal.fleet.actions import ActionPlanner, CheckpointBook
from ray_ormas._internal.head.fleet_metrics import ACTIONS_EXPORTED, EXPORTED, PREFLIGHT_EXPORTED
from ray_ormas._internal.head.rank_stacks import RankHandle

from .loops import digits_loop
from .scenario_runs import ACTS, PHASE_TIMEOUT_S
from .scenarios.acts import HANG_AFTER_S, RUN_NAME


@dataclass
class ActedFit:
    storage: Path
    outcome: dict

    @property
    def run_dir(self) -> Path:
        return self.storage / RUN_NAME

    @property
    def error(self) -> str:
        """The message of the error fit() raised."""
        return self.outcome["raised"]["message"]

    def actions(self) -> list[dict]:
        return [
            json.loads(line) for line in ray_ormas.open_records(self.run_dir).fleet_actions().column("line").to_pylist()
        ]

    def alarms(self) -> list[dict]:
        return ray_ormas.open_records(self.run_dir).fleet_alarms().to_pylist()


@pytest.fixture(scope="module")
def acted(multi_node) -> ActedFit:
    """The fit of tests/scenarios/acts.py, run on the elastic scenario's simulated cluster."""
    run, base, _ = multi_node["elastic"]
    log = run.wait()
    assert (base / f"{ACTS}.json").is_file(), log[-4000:]
    outcome = json.loads((base / f"{ACTS}.json").read_text())
    assert "error" not in outcome and "raised" in outcome, (outcome, log[-4000:])
    return ActedFit(base / "runs" / ACTS, outcome)


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_stop_action_ends_the_fit_with_the_packages_error_naming_the_alarm_rank_node_and_step(acted):
    message = acted.error
    [nonfinite] = [a for a in acted.alarms() if a["kind"] == "nonfinite"]
    assert "nonfinite alarm" in message and "rank 1 on node" in message and "run step 45" in message, message
    assert nonfinite["node"] in message and nonfinite["ranks"] == [1] and nonfinite["run_step"] == 45
    # The fit ran as a Ray Tune trial: the trial's error is the FleetStopError fit() raised (a
    # RayOrmasError), and Tune (max_failures 0, its default) did not run the trial again.
    raised = acted.outcome["raised"]
    assert raised["fleet_stop"] and raised["ray_ormas_error"], raised
    assert len(ray_ormas.open_records(acted.run_dir).fleets()) == 1  # one fit: no second one by Tune
    # The ranks ran on two nodes, neither of them the head (the scenario's nodes have the slots).
    first_two = list(acted.outcome["starts"].values())[:2]
    assert len(set(first_two)) == 2, acted.outcome["starts"]
    # Ray did not retry it: five attempts, though max_failures=5 would have allowed more.
    attempts = ray_ormas.open_records(acted.run_dir).fleet_attempts().to_pylist()
    # (attempt 3 never reached its first step: its screen evicted a node; it has no attempt line,
    # its screen is in the fleet record's preflight table)
    assert [a["attempt"] for a in attempts] == [0, 1, 2, 4]
    stop = next(a for a in acted.actions() if a["alarm"] == "nonfinite")
    assert (stop["action"], stop["outcome"], stop["ranks"]) == ("stop", "done", [1])
    # At the same check the policy asked to restart the group (reading the rows' `nonfinite`):
    # two alarms at one check, the most severe carried out, the other recorded as superseded.
    superseded = next(a for a in acted.actions() if a["alarm"] == "policy" and a["attempt"] == 4)
    said = (superseded["action"], superseded["outcome"], superseded["requested"])
    assert said == ("log", "superseded", ["reattempt"]), superseded
    assert "the nonfinite alarm's stop at the same check comes first" in superseded["reason"]
    assert superseded["run_step"] == 45
    # Every rank raised at the same check, so rank 0 closed the last segment: it verifies.
    records = ray_ormas.open_records(acted.run_dir)
    last = records.segments("model")[-1]
    assert last.attempt == 4
    assert verify_run(acted.run_dir / "ormas" / "model" / Path(last.path).name).ok


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_divergence_restarts_from_the_last_checkpoint_the_replicas_agreed_on(acted):
    [divergence] = [a for a in acted.alarms() if a["kind"] == "divergence"]
    assert (divergence["attempt"], divergence["run_step"], divergence["ranks"]) == (0, 25, [1])
    action = next(a for a in acted.actions() if a["alarm"] == "divergence")
    assert action["action"] == "reattempt" and action["outcome"] == "done"
    # The checkpoint at run step 30 was taken after the damage: the restart resumed from 20.
    assert action["checkpoint_run_step"] == 20 and "run step 20" in action["why"], action
    assert action["resumed_run_step"] == 20  # where the restarted group began, as its outcome says
    import torch

    # The checkpoint at run step 20 was reported but not yet registered by Ray at the alarm (the
    # line's `checkpoint` is empty); the outcome names the one the group resumed from.
    resumed = torch.load(Path(action["resumed_from"]) / "state.pt", weights_only=True)
    assert resumed["step"] == 20 and 0 < action["seconds"] < 120  # the checkpoint the group resumed from
    records = ray_ormas.open_records(acted.run_dir)
    segments = {s.attempt: s for s in records.segments("model")}
    assert segments[1].step_offset == 20  # the record continues from the checkpoint it resumed from
    # After the restart, the replicas agree again at every check (one digest per check).
    checks = records.fleet_checks().to_pylist()
    later = {}
    for c in checks:
        if c["attempt"] >= 1 and c["loss"] is not None and c["loss"] == c["loss"]:
            later.setdefault((c["attempt"], c["check"]), set()).add(c["digest"])
    assert later and all(len(d) == 1 for d in later.values()), later


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_rank_blocked_forever_is_named_its_stack_captured_and_the_group_restarted(acted):
    [hang] = [a for a in acted.alarms() if a["kind"] == "hang"]
    assert hang["attempt"] == 1 and "no rank has reached a new check" in hang["message"]
    action = next(a for a in acted.actions() if a["alarm"] == "hang")
    assert action["diagnose"] is True and action["action"] == "reattempt" and action["outcome"] == "done"
    stacks = action["stacks"]
    assert "block_forever_before_backward" in stacks["1"], stacks  # the test loop's blocking function
    assert action["seconds"] < 120
    # `hang: ["diagnose", "evict"]` was asked; the hang names every rank (rank 0 waits in the
    # all-reduce), so an evict would take every node of the group: none is kept out or drained,
    # the group restarts, and the line says why.
    assert hang["ranks"] == [0, 1] and action["requested"] == ["diagnose", "evict"], action
    assert "the alarm names every rank (2 of 2)" in action["reason"] and "evicted_ids" not in action
    assert acted.outcome["draining"] == []


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_an_evict_in_a_tune_trial_restarts_the_group_on_the_spare_node(acted):
    # Each attempt's two ranks wrote their node when they started, in that order (the loop's
    # start, after the pre-flight screen: attempt 3's ranks never started their loop).
    starts = list(acted.outcome["starts"].items())
    nodes = [{name.rsplit("-", 1)[1]: node for name, node in starts[i : i + 2]} for i in range(0, len(starts), 2)]
    assert len(nodes) == 4 and all(set(n) == {"rank0", "rank1"} for n in nodes), starts
    # Attempt 3's screen: the probe failed on rank 1, named broken before the first step.
    screens = ray_ormas.open_records(acted.run_dir).fleet_preflight().to_pylist()
    broken = next(r for r in screens if r["attempt"] == 3 and r["rank"] == 1)
    assert "not mounted" in json.loads(broken["broken"])["tests.loops:StorageLostOnRank"], broken
    [asked] = [a for a in acted.alarms() if a["kind"] == "preflight" and a["ranks"] == [1]]
    assert asked["attempt"] == 3 and asked.get("run_step") is None
    evict = next(a for a in acted.actions() if a["alarm"] == "preflight")
    assert (evict["action"], evict["outcome"], evict["evicted_ids"]) == ("evict", "done", [broken["node_id"]]), evict
    # The next attempt ran without it (on the node left and the spare); the node was only kept out
    # of this run: alive, and not drained (no other run on it would be preempted).
    assert broken["node_id"] not in nodes[3].values() and len(set(nodes[3].values())) == 2
    assert acted.outcome["alive"][broken["node_id"]] is True and acted.outcome["draining"] == []
    # Ray's latest checkpoint when the action was decided (30: attempt 2 failed at step 34); the
    # group resumed from Ray's latest, having trained nothing on the broken node.
    assert evict["resumed_run_step"] >= evict["checkpoint_run_step"] >= 30 and 0 < evict["seconds"] < 120
    # Every attempt was screened, two ranks each, and only attempt 3's rank 1 was named.
    assert sorted((r["attempt"], r["rank"]) for r in screens) == [(a, r) for a in range(5) for r in (0, 1)]
    assert [(r["attempt"], r["rank"]) for r in screens if r["broken"] != "{}" or r["slow"]] == [(3, 1)], screens


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_a_hang_error_lands_in_the_fleet_record(acted):
    # Ray's NCCL hang detector needs NCCL (GPUs); on CPU the loop raises the same error class.
    nccl = [a for a in acted.alarms() if a["kind"] == "nccl_hang"]
    assert [(a["attempt"], a["ranks"]) for a in nccl] == [(2, [1])]
    assert "NCCLHangError" in nccl[0]["message"]
    assert not [a for a in acted.actions() if a["alarm"] == "nccl_hang"]  # Ray's own restart, no action


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_actions_are_in_mlflow(acted):
    client = MlflowClient(tracking_uri=f"sqlite:///{acted.run_dir / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs(client.search_experiments()[0].experiment_id)
    for kind, step in (("divergence", 25), ("nonfinite", 45)):
        [logged] = client.get_metric_history(run.info.run_id, f"fleet/actions/{kind}")
        assert (logged.value, logged.step) == (1.0, step)
    assert client.get_metric_history(run.info.run_id, "fleet/actions/hang")
    [fit_id] = ray_ormas.open_records(acted.run_dir).fleets()  # the stacks, with the fleet record, as artifacts
    uploaded = [a.path for a in client.list_artifacts(run.info.run_id, f"ormas/fleet/{fit_id}")]
    assert f"ormas/fleet/{fit_id}/stacks.jsonl" in uploaded and f"ormas/fleet/{fit_id}/actions.jsonl" in uploaded
    # The goodput account's params (the fit was stopped: its account closed all the same).
    params = client.get_run(run.info.run_id).data.params
    assert params["goodput.restarts"] == "4" and "a divergence reattempt" in params["goodput.restart_causes"]


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_each_restart_is_counted_under_the_alarm_and_action_that_caused_it(acted):
    (account,) = ray_ormas.open_records(acted.run_dir).goodput_per_fit()
    assert account.closed and sum(account.buckets.values()) == pytest.approx(account.wall_s)
    causes = [r.cause for r in account.restarts]
    assert causes == ["divergence reattempt", "hang reattempt", "worker failure", "preflight evict"], causes
    assert "NCCLHangError" in (account.restarts[2].error or "")
    # The divergence's restart redid the steps after the checkpoint it chose (run step 20).
    assert account.restarts[0].lost_steps >= 25 - 20 and account.restarts[0].lost_s > 0
    # The hang: from the last check the ranks reached to the alarm, about the bound (4 s).
    assert HANG_AFTER_S * 0.8 < account.buckets["hang"] < HANG_AFTER_S * 3, account.buckets
    assert all(r.restart_s > 0 for r in account.restarts)
    assert account.buckets["other"] < 0.02 * account.wall_s


# ------------------------------------------------------------------ on the shared busy fit (tests/shared_fits.py)
@pytest.mark.timeout(300)
def test_a_policy_of_your_own_sees_every_check_and_its_action_is_carried_out(busy_fit):
    # tests/loops.py's diagnose_rank_1_at_check_3: counts the views it is shown, in its own memory.
    [asked] = [a for a in busy_fit.result.ormas.fleet.alarms if a["kind"] == "policy"]
    assert (asked["attempt"], asked["check"], asked["ranks"], asked["chain"]) == (0, 3, [1], ["diagnose"])
    assert "tests.loops:diagnose_rank_1_at_check_3 asks to diagnose on ranks [1]: shown 4 checks" in asked["message"]
    action = next(a for a in busy_fit.result.ormas.fleet.actions if a["alarm"] == "policy")
    assert (action["action"], action["diagnose"], action["run_step"], action["outcome"]) == ("log", True, 15, "done")
    assert action["diagnosed"] == "stacks of ranks 1"
    assert "digits_loop" in action["stacks"]["1"], action["stacks"]  # rank 1, in the test's loop


@pytest.mark.timeout(300)
def test_the_fleet_and_its_actions_are_in_rays_metrics(busy_fit):
    # Ray's own metrics, as Prometheus scrapes them from the head node's metrics agent while the
    # run trains (the busy fit's rank 0 read them every 2 s): the fleet's gauges and alarm
    # counter, and the actions' counter (the busy fit's diagnoses, carried out as "log": they only
    # take stacks). Read during the run: Ray drops a gauge about 20 s after its last report.
    text = (busy_fit.storage / "metrics.txt").read_text()
    for name in [ACTIONS_EXPORTED, PREFLIGHT_EXPORTED, *EXPORTED.values()]:
        assert name in text, f"{name} is not among Ray's exported metrics"
    # The pre-flight screen's gauge, one series per node and probe (one node here).
    screened = [
        line
        for line in text.splitlines()
        if line.startswith(PREFLIGHT_EXPORTED + "{") and 'probe="compute"' in line and 'run="busy"' in line
    ]
    assert screened and float(screened[0].rsplit(" ", 1)[1]) > 0, screened
    assert 'action="log"' in text and 'kind="hang"' in text and 'run="busy"' in text
    # The goodput gauges (head/goodput_keeper.py): the fit's goodput so far, and its seconds by bucket.
    goodput = re.findall(r'ray_ormas_goodput\{[^}]*run="busy"[^}]*window="fit"[^}]*\} ([0-9.e+-]+)', text)
    assert goodput and all(0 < float(v) <= 1 for v in goodput), goodput
    assert re.search(r'ray_ormas_goodput_seconds\{[^}]*bucket="data_wait"', text)


@pytest.mark.timeout(300)
def test_a_hang_diagnosed_shows_where_the_stuck_rank_is(busy_fit):
    # The busy fit's rank 1 sleeps between step 100's backward and its check: `hang` -> diagnose.
    action = next(a for a in busy_fit.result.ormas.fleet.actions if a["alarm"] == "hang")
    assert action["ranks"] == [1] and action["diagnose"] is True and action["action"] == "log"
    assert action["node"] == busy_fit.result.ormas.fleet.ranks[1]["node"]  # the stuck rank's node, as its stacks'
    assert "stall_between_backward_and_check" in action["stacks"]["1"], action["stacks"]
    assert busy_fit.result.ormas.fleet.checks == 40  # only stacks were taken: the training went on


# ------------------------------------------------------------------ the rules, without Ray
def alarm(kind: str, attempt: int = 0, run_step: int = 10, ranks: tuple[int, ...] = (1,)) -> FleetAlarm:
    return FleetAlarm(kind, f"a {kind} alarm", attempt=attempt, run_step=run_step, ranks=ranks, node="10.0.0.2")


def lines_into(written: list) -> Any:
    """A `write` for FleetActions that keeps the record's lines, as the fleet record gets them."""
    return lambda name, records: written.extend(r.to_line() for r in records)


def test_at_most_max_actions_then_an_alarm_only_logs_and_says_why():
    planner = ActionPlanner(FleetSettings(actions={"straggler": "reattempt"}, max_actions=2))
    lines = [planner.decide(alarm("straggler", attempt=a)).to_line() for a in range(4)]
    assert [x["action"] for x in lines] == ["reattempt", "reattempt", "log", "log"]
    assert lines[2]["outcome"] == "bounded" and "max_actions (2)" in lines[2]["reason"]
    assert planner.decide(alarm("divergence")) is None  # no action asked: it logs as it always did


def test_one_action_per_attempt_and_a_diagnose_chain():
    planner = ActionPlanner(FleetSettings(actions={"hang": ["diagnose", "stop"], "straggler": "reattempt"}))
    first = planner.decide(alarm("hang"))
    assert (first.action, first.diagnose) == ("stop", True)
    second = planner.decide(alarm("straggler"))
    assert second.action == "log" and "already being acted on" in second.reason
    assert planner.decide(alarm("straggler", attempt=1)).action == "reattempt"


def test_a_restart_after_damage_skips_the_checkpoints_taken_after_the_last_clean_check():
    book = CheckpointBook()
    book.checked(0, 10, clean=True)
    book.taken(10, 0, "ckpt-10")
    book.announced(0, 20)  # the ranks met to report it; Ray registers it later
    book.checked(0, 20, clean=True)
    book.taken(22, 0, "ckpt-22")  # between the last clean check and the damaged one
    book.checked(0, 25, clean=False)
    book.damaged(0)
    assert book.last_good() == (20, None)  # chosen before Ray registered it
    book.taken(20, 0, "ckpt-20")
    book.taken(30, 0, "ckpt-30")  # while the replicas disagree
    assert book.last_good() == (20, "ckpt-20") and book.resume_override() == "ckpt-20"
    assert [b.suspect for b in book._books] == [False, False, True, True]
    book.checked(1, 20, clean=True)  # the restarted attempt
    book.taken(30, 1, "ckpt-30b")
    assert book.resume_override() is None  # Ray's latest is clean again
    assert CheckpointBook().resume_override() is None


@pytest.mark.parametrize(
    "actions, words",
    [
        ({"stragler": "log"}, "'stragler' is not an alarm kind that can act; the kinds are straggler"),
        ({"hang": "restart"}, "hang: unknown action 'restart'; the actions are log, reattempt, evict, stop, diagnose"),
        ({"hang": ["evict", "stop"]}, "hang: ['evict', 'stop'] is not a chain of actions"),
        (
            {"hang": ["stop", "diagnose"]},
            "hang: ['stop', 'diagnose'] is not a chain of actions: give one action, or 'diagnose' and then",
        ),
        ({"hang": []}, "hang: give an action or a list of them"),
        (["hang"], "must map alarm kinds to actions"),
    ],
)
def test_bad_actions_are_refused_naming_the_option(actions, words):
    pattern = "^FleetSettings.actions: " + words.replace("[", r"\[").replace("(", r"\(")
    with pytest.raises(ray_ormas.OptionError, match=pattern):  # a ValueError too
        FleetSettings(actions=actions)
    with pytest.raises(ray_ormas.OptionError, match="^FleetSettings.actions: "):  # as a YAML config's error says it
        build(FleetSettings, actions=actions)


def test_actions_are_checked_against_the_rest_of_the_trainer_on_the_driver():
    two = ScalingConfig(num_workers=2)
    restarts = RunConfig(failure_config=FailureConfig(max_failures=1))
    for action in ("reattempt", "evict"):
        with pytest.raises(ray_ormas.OptionError, match=r"a restart is a failure to Ray: give RunConfig\("):
            RayOrmasTrainer(digits_loop, fleet=FleetSettings(actions={"divergence": action}), scaling_config=two)
    with pytest.raises(ray_ormas.OptionError, match="enabled=False turns fleet health off"):
        RayOrmasTrainer(
            digits_loop, fleet=FleetSettings(enabled=False, actions={"nonfinite": "stop"}), scaling_config=two
        )
    with pytest.raises(ray_ormas.OptionError, match="with one worker there are none"):
        RayOrmasTrainer(
            digits_loop, fleet=FleetSettings(actions={"nonfinite": "stop"}), scaling_config=ScalingConfig(num_workers=1)
        )
    trainer = RayOrmasTrainer(
        digits_loop, fleet=FleetSettings(actions={"divergence": "reattempt"}), scaling_config=two, run_config=restarts
    )
    assert trainer.fleet.action_for("divergence") == ("reattempt",) and trainer.fleet.action_for("hang") == ("log",)


@pytest.mark.timeout(PHASE_TIMEOUT_S)
def test_actions_show_in_the_report_and_on_the_run_page(acted, capsys, tmp_path):
    from ray_ormas._internal.cli.main import main

    assert main(["report", str(acted.run_dir), "--out", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out
    assert "action: reattempt after the divergence alarm on ranks 1 at run step 25: done" in out, out
    assert "resumed at run step 20" in out
    assert "action: diagnose, then reattempt after the hang alarm" in out and "stacks of ranks" in out
    assert "action: stop after the nonfinite alarm on ranks 1 at run step 45: done" in out
    page = (acted.run_dir / "ormas" / "run.html").read_text()
    assert page.count("<li class='action'") == 5 and "data-action='stop'" in page  # the superseded one too


def test_a_policy_that_raises_or_answers_wrong_is_named_once_and_not_called_again(tmp_path):
    from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
    from ray_ormas._internal.record.store import RecordStore

    from .test_fleet import facts

    calls = []

    def broken(view):
        calls.append(view.check)
        raise KeyError("rank")

    def wrong(view):
        return "reattempt"  # not a FleetAction

    for policy, words in ((broken, "raised KeyError: 'rank'"), (wrong, "raised OptionTypeError: returned str")):
        store = RecordStore.at(str(tmp_path / policy.__name__))
        head = FleetHead(FleetSpec(FleetSettings(ray_metrics=False, policy=policy), store, "fit", "run", 2, "ddp"))
        for check in range(3):
            for rank in (0, 1):
                head.facts(0, facts(rank, check))
        [alarm] = head.finish().alarms
        assert alarm["kind"] == "policy" and words in alarm["message"] and "not called again" in alarm["message"]
    assert calls == [0]  # the broken policy was called once


def test_a_policy_gets_every_ranks_row_the_alarms_so_far_and_its_own_memory(tmp_path):
    from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
    from ray_ormas._internal.record.store import RecordStore

    from .test_fleet import facts

    seen = []

    def rule(view: ray_ormas.FleetView):
        # Typed and frozen (a policy cannot change what the head keeps); the dict reads of the
        # policies written before still work (the test below this one reads attributes).
        assert all(isinstance(r, ray_ormas.RankRow) for r in view.ranks)
        assert all(isinstance(a, ray_ormas.FleetAlarm) for a in view.alarms)
        with pytest.raises(dataclasses.FrozenInstanceError):
            view.ranks[0].slow = True  # type: ignore[misc]
        view.memory["n"] = view.memory.get("n", 0) + 1
        seen.append((view.check, [r["rank"] for r in view.ranks], [a["kind"] for a in view.alarms], view.memory["n"]))
        if view.check == 2:
            return ray_ormas.FleetAction(["diagnose", "stop"], ranks=[1], reason="slow on purpose")
        return None

    store = RecordStore.at(str(tmp_path / "ormas"))
    head = FleetHead(FleetSpec(FleetSettings(ray_metrics=False, policy=rule), store, "fit", "run", 2, "ddp"))
    for check in range(3):
        for rank in (0, 1):
            head.facts(0, facts(rank, check, digest="x" if (rank, check) == (1, 1) else "d"))
    assert seen == [
        (0, [0, 1], [], 1),
        (1, [0, 1], ["divergence"], 2),
        (2, [0, 1], ["divergence", "divergence_resolved"], 3),
    ]
    # The ranks ended their loop after that check: they get the stop, once the diagnose is done
    # (and so would a later attempt's, had Ray restarted the group before the stop was heard).
    assert head.order_at_end(0).action == "stop" and head.order_at_end(1).action == "stop"
    summary = head.finish()  # waits for the diagnose, which finds no worker to read (no Ray here)
    [asked] = [a for a in summary.alarms if a["kind"] == "policy"]
    assert asked["chain"] == ["diagnose", "stop"] and asked["node"] == "10.0.0.1"
    assert "asks to diagnose then stop on ranks [1]: slow on purpose" in asked["message"]
    [action] = summary.actions
    assert (action["alarm"], action["diagnose"], action["action"]) == ("policy", True, "stop")
    assert "no stacks: the named ranks' workers are not known" in action["diagnosed"]
    assert action["outcome"] == "not carried out"  # no rank was there to read the order
    assert head.order_for(0).action == "stop" and "slow on purpose" in head.stop_message()


def test_the_docs_worked_policy_names_a_rank_slow_for_3_checks_and_evicts_it_at_10():
    import ast
    import re

    text = (Path(__file__).parents[1] / "docs" / "fleet-health.md").read_text()
    [code] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def slow_ten_checks_on_one_node" in b]
    tree = ast.parse(code)
    scope: dict = {}
    exec(
        compile(ast.Module([n for n in tree.body if not isinstance(n, ast.Assign)], []), "fleet-health.md", "exec"),
        scope,
    )
    rule, memory, asked = scope["slow_ten_checks_on_one_node"], {}, {}
    for check in range(12):
        rows = tuple(ray_ormas.RankRow(r, node=f"10.0.0.{r}", slow=r == 1 and check >= 1) for r in range(4))
        got = rule(ray_ormas.FleetView(0, check, check * 5, check * 5, rows, (), memory))
        if got is not None:
            asked[check] = (got.chain(), list(got.ranks), got.reason)
    assert asked == {
        3: (("log",), [1], "slow for 3 checks on 10.0.0.1"),
        10: (("diagnose", "evict"), [1], "slow for 10 checks on 10.0.0.1"),
    }


def test_a_restart_after_damage_with_no_checkpoint_before_it_only_logs_and_says_why():
    from ray_ormas._internal.head.fleet_actions import FleetActions

    written: list[tuple[str, dict]] = []
    acts = FleetActions(
        FleetSettings(actions={"divergence": "reattempt", "straggler": "reattempt"}),
        lambda name, lines: written.extend((name, x.to_line()) for x in lines),
    )
    acts.book.checked(0, 10, clean=True)
    acts.book.taken(20, 0, "ckpt-20")  # taken after the last clean check: the damage may be in it
    acts.on_alarms([alarm("divergence", run_step=25)])
    [(_, line)] = written
    assert (line["action"], line["outcome"]) == ("log", "failed") and acts.order_for(0) is None
    assert "no checkpoint was taken before the damage" in line["reason"] and "run step 10" in line["reason"]
    assert acts._planner.taken == 0  # it does not count against max_actions
    acts.on_alarms([alarm("straggler")])  # the attempt was not acted on: a later alarm of it may act
    assert acts.order_for(0).action == "reattempt"
    assert written[-1][1]["checkpoint_run_step"] == 20 and written[-1][1]["why"].startswith("Ray's latest checkpoint")


def _evicting_fleet(monkeypatch, written: list[dict], **settings) -> Any:
    """FleetActions over three ranks (0 on the head node, 1 and 2 on worker nodes w1 and w2) in
    attempts 0-3. Which node is the head node, the nodes alive and the drain are Ray's
    (tests/test_node_loss.py evicts for real); here they are given, to reach each bound."""
    from ray_ormas._internal.head import fleet_actions, node_eviction

    acts = fleet_actions.FleetActions(
        FleetSettings(**{"actions": {"straggler": "evict", "hang": "evict"}, **settings}),
        lines_into(written),
        driver_node="driver-node",
        shape=node_eviction.GroupShape({"CPU": 1.0, "slot": 1.0}, 3),
    )
    for attempt in range(4):
        for rank, node in ((0, "head-node"), (1, "w1"), (2, "w2")):
            acts.rank_joined(attempt, RankHandle(rank, None, node, f"name-{node}", 100 + rank))
    monkeypatch.setattr(node_eviction, "_never_evicted", lambda driver: {"head-node": "the head node", driver: "x"})
    monkeypatch.setattr(fleet_actions, "stacks_of_ranks", lambda handles: {h.rank: f"stack {h.rank}" for h in handles})
    one = {"CPU": 1.0, "slot": 1.0}
    nodes = {"head-node": one, "w1": one, "w2": one, "spare": one}
    monkeypatch.setattr(node_eviction, "_alive_nodes", lambda: nodes)
    return acts


def _no_drain(node_id: str, why: str, timeout_s: float) -> str:
    raise AssertionError("a run-scoped evict must not drain")


def test_an_evict_is_the_runs_by_default_and_drains_nothing(monkeypatch):
    from ray_ormas._internal.head import node_eviction

    written: list[dict] = []
    acts = _evicting_fleet(monkeypatch, written)
    monkeypatch.setattr(node_eviction, "drain_node", _no_drain)
    acts.on_alarms([alarm("straggler", ranks=(1,))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    assert acts.order_for(0).action == "reattempt" and acts.excluded_nodes() == ["w1"]
    [line, outcome] = written
    assert (line["action"], outcome["evicted_ids"], outcome["scope"]) == ("evict", ["w1"], "run")
    assert "kept out of this run" in acts.order_for(0).message


def test_an_evict_that_cannot_drain_restarts_or_logs_and_says_why(monkeypatch):
    from ray_ormas._internal.head import node_eviction

    written: list[dict] = []
    acts = _evicting_fleet(monkeypatch, written, evict_scope="cluster")
    monkeypatch.setattr(
        node_eviction, "drain_node", lambda node_id, why, timeout_s: "the node is already being drained"
    )
    # On the head node: never evicted, the group restarts instead (still an action).
    acts.on_alarms([alarm("straggler", ranks=(0,))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    assert acts.order_for(0).action == "reattempt" and acts._planner.taken == 1
    fell = written[-1]
    assert fell["action"] == "reattempt"
    assert fell["reason"] == "node name-head-node is the head node, which is never evicted"
    # A drain Ray refuses: the alarm only logs, with Ray's reason, and it does not count.
    acts.on_alarms([alarm("straggler", attempt=1, ranks=(1,))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    refused = written[-1]
    assert (refused["action"], refused["outcome"]) == ("log", "failed") and acts.order_for(1) is None
    assert refused["reason"] == "Ray refused to drain node name-w1: the node is already being drained"
    assert acts._planner.taken == 1


def test_an_evict_is_bounded_in_nodes_in_room_and_never_reaches_every_rank(monkeypatch):
    from ray_ormas._internal.head import node_eviction

    written: list[dict] = []
    acts = _evicting_fleet(monkeypatch, written, max_actions=5)
    monkeypatch.setattr(node_eviction, "drain_node", _no_drain)
    # Two nodes named, max_evict_nodes=1: the group restarts, nothing is excluded.
    acts.on_alarms([alarm("straggler", ranks=(1, 2))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    assert acts.order_for(0).action == "reattempt" and acts.excluded_nodes() == []
    assert "run on 2 nodes, more than max_evict_nodes (1)" in written[-1]["reason"]
    # Every rank named (as a collective hang names them): stacks first, then a restart, and why.
    acts.on_alarms([alarm("straggler", attempt=1, ranks=(0, 1, 2))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    every = next(x for x in written if x.get("attempt") == 1 and "action" in x)
    assert (every["action"], every["diagnose"], every["requested"]) == ("reattempt", True, ["evict"])
    assert "names every rank (3 of 3)" in every["reason"]
    assert acts.order_for(1).action == "reattempt" and acts.excluded_nodes() == []
    # One node out leaves room (the spare); a second would leave two slots for three workers.
    acts.on_alarms([alarm("straggler", attempt=2, ranks=(1,))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    assert acts.excluded_nodes() == ["w1"]
    acts.on_alarms([alarm("straggler", attempt=3, ranks=(2,))])
    acts.wait_for_actions()  # an evict is carried out on the action thread
    assert acts.order_for(3).action == "reattempt" and acts.excluded_nodes() == ["w1"]
    assert "the cluster has room for 2 of the group's 3 workers" in written[-1]["reason"]


def test_two_alarms_at_one_check_the_most_severe_acts_and_both_are_recorded():
    from ray_ormas._internal.head.fleet_actions import FleetActions

    written: list[dict] = []
    acts = FleetActions(
        FleetSettings(actions={"straggler": "reattempt", "nonfinite": "stop"}),
        lines_into(written),
    )
    acts.on_alarms([alarm("straggler"), alarm("nonfinite")])  # the analyzer's order: straggler first
    assert acts.order_for(0).action == "stop" and acts.stop_message().startswith("stopped by the fleet's nonfinite")
    stop, straggler = written
    assert (stop["alarm"], stop["action"], stop["outcome"]) == ("nonfinite", "stop", "requested")
    assert (straggler["alarm"], straggler["action"], straggler["outcome"]) == ("straggler", "log", "superseded")
    assert straggler["requested"] == ["reattempt"] and "nonfinite alarm's stop" in straggler["reason"]
    assert acts._planner.taken == 1  # the superseded one does not count


def test_a_restart_whose_group_its_screen_ends_is_done_though_nothing_resumed():
    from ray_ormas._internal.head.fleet_actions import FleetActions

    # Attempt 2's reattempt restarts the group; attempt 3's screen stops the fit before its first
    # step (as in the elastic DDP fit, tests/scenarios/elastic.py): the reattempt was carried out.
    written: list[dict] = []
    acts = FleetActions(FleetSettings(actions={"straggler": "reattempt", "preflight": "stop"}), lines_into(written))
    acts.on_alarms([alarm("straggler", attempt=2)])
    acts.on_alarms([alarm("preflight", attempt=3)])
    assert acts.order_for(3).action == "stop"
    acts.attempt_screened_out(3)
    reattempt = next(line for line in written if line.get("action") == "reattempt")
    [outcome] = [line for line in written if line.get("event") == "outcome" and line["id"] == reattempt["id"]]
    assert outcome["outcome"] == "done" and "resumed_run_step" not in outcome, outcome
    assert outcome["reason"] == "the group restarted (attempt 3); its pre-flight screen ended it before its first step"
    acts.finished(stopped=True)  # the stop itself: done, with the fit's FleetStopError
    ends = {line["id"]: line["outcome"] for line in written if line.get("event") == "outcome"}
    assert list(ends.values()) == ["done", "done"], written


@pytest.mark.usefixtures("ray_cluster")
def test_an_evict_on_a_cluster_of_one_node_is_said_before_the_fit(caplog):
    from ray_ormas._internal.driver.capacity import lone_node_eviction

    # The session's cluster has one node: fit() refuses it when it started the cluster itself
    # (the CLI's case is tests/test_storage_paths.py), and warns on a cluster it joined.
    said = lone_node_eviction(FleetSettings(actions={"straggler": "evict", "hang": ["diagnose", "evict"]}))
    assert said.startswith("FleetSettings.actions evicts on hang, straggler alarms, and this Ray cluster has one node")
    assert "use 'reattempt'" in said
    assert lone_node_eviction(FleetSettings(actions={"straggler": "reattempt"})) is None
    assert lone_node_eviction(None) is None


def sleep_a_minute_at_check_1(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A policy that stalls: at check 1 it sleeps 60 s before it answers."""
    if view.check == 1:
        time.sleep(60)
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stall", ["policy", "py-spy", "drain"])
def test_the_ledger_keeps_answering_while_a_policy_a_drain_or_py_spy_never_returns(stall, monkeypatch, tmp_path):
    # The run ledger's own class, in this process, on an event loop that also ticks every 10 ms:
    # the longest gap between ticks is the longest the ledger could not answer. One stall each: a
    # policy that sleeps 60 s (its limit lowered to 1 s); or a NaN whose action is
    # ["diagnose", "evict"] (a drain for the whole cluster) with a py-spy, or a drain, that never
    # returns (replaced seams). The fit then ends: nothing the stuck action does reaches the record.
    import asyncio
    import threading

    from ray_ormas._internal.fleet.facts import RankFacts
    from ray_ormas._internal.head import fleet_actions, node_eviction, policy_runner
    from ray_ormas._internal.head.fleet_head import FleetSpec
    from ray_ormas._internal.head.ledger import Ledger
    from ray_ormas._internal.record.store import RecordStore

    never = threading.Event()
    drained: list[str] = []

    def drain(node_id: str, why: str, timeout_s: float) -> None:
        drained.append(node_id)
        never.wait(60)

    def stacks(handles: list) -> dict:
        if stall == "py-spy":
            never.wait(60)
        return {h.rank: f"stack {h.rank}" for h in handles}

    monkeypatch.setattr(policy_runner, "POLICY_LIMIT_S", 1.0)
    monkeypatch.setattr(fleet_actions, "ACTION_WAIT_S", 1.0)
    monkeypatch.setattr(fleet_actions, "EVICT_SETTLE_S", 1.0)
    monkeypatch.setattr(fleet_actions, "stacks_of_ranks", stacks)
    monkeypatch.setattr(node_eviction, "drain_node", drain)
    monkeypatch.setattr(node_eviction, "_never_evicted", lambda driver: {})
    monkeypatch.setattr(node_eviction, "_alive_nodes", lambda: {n: {"CPU": 1.0} for n in ("w0", "w1", "spare")})
    settings = FleetSettings(
        ray_metrics=False,
        actions={"nonfinite": ["diagnose", "evict"]} if stall != "policy" else {},
        evict_scope="cluster",
        policy=sleep_a_minute_at_check_1 if stall == "policy" else None,
    )
    ledger = Ledger(None, FleetSpec(settings, RecordStore.at(str(tmp_path)), "fit", "run", 2, "ddp", min_workers=2))

    def facts(rank: int, check: int, nan: bool = False) -> RankFacts:
        return RankFacts(
            rank=rank, check=check, step=check * 5, node=f"name-w{rank}", data_s=0.001, forward_s=0.01,
            wall_s=0.02, timed_steps=5, forwards=5, loss=float("nan") if nan else 1.0, nonfinite_loss=nan,
            digest="d", groups=("d",),
        )  # fmt: skip

    async def run() -> tuple[float, list, Any]:
        gaps, ticking = [0.0], True

        async def tick() -> None:
            last = time.monotonic()
            while ticking:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        for rank in (0, 1):
            ledger.fleet_rank("t0", rank, None, f"w{rank}", f"name-w{rank}", 100 + rank)
        answers = []
        for check in range(5):
            nan = stall != "policy" and check == 3
            answers += await asyncio.gather(
                *(ledger.fleet_facts("t0", facts(r, check, nan and r == 1)) for r in (0, 1))
            )
            if check == 1:  # a checkpoint before the NaN, to restart from
                ledger.checkpoint_taken(5, "checkpoint-at-5")
        await asyncio.sleep(1.5)  # the action is stuck meanwhile
        summary = await ledger.finish_fleet()
        ticking = False
        await ticker
        return max(gaps), answers, summary

    longest, answers, summary = asyncio.run(run())
    never.set()
    print(f"{stall}: the longest the ledger did not answer: {longest * 1000:.0f} ms")
    assert longest < 1.0, longest
    assert answers == [None] * 10  # no order was ever given: the stuck action never carried out
    if stall == "policy":
        [policy] = [a for a in summary.alarms if a["kind"] == "policy"]
        assert "sleep_a_minute_at_check_1 gave no answer within 1 s (its time limit)" in policy["message"]
        assert summary.actions == []
        return
    [action] = summary.actions
    assert (action["alarm"], action["action"], action["diagnose"]) == ("nonfinite", "evict", True)
    assert ("stacks" in action) == (stall == "drain") and drained == (["w1"] if stall == "drain" else [])
    assert action["outcome"] == "not carried out" and "the fit ended while the action was under way" in action["reason"]


def test_a_fault_back_in_a_new_attempt_is_alarmed_again_and_counts():
    # A NaN in attempt 0, restarted; the NaN is back at attempt 1's first check, before any clean
    # check: alarmed again, and its action counts towards max_actions. The same for divergence.
    from ray_ormas._internal.fleet.analysis import FleetAnalyzer
    from ray_ormas._internal.fleet.facts import RankFacts

    analyzer = FleetAnalyzer(FleetSettings(), 2, compare_digests=True)
    planner = ActionPlanner(FleetSettings(actions={"nonfinite": "reattempt", "divergence": "reattempt"}, max_actions=5))

    def check(attempt: int, check: int, nan: bool = False, digests: tuple[str, str] = ("d", "d")) -> list[str]:
        kinds = []
        for rank in (0, 1):
            got = analyzer.add(
                attempt,
                RankFacts(rank=rank, check=check, step=check * 5, loss=float("nan") if nan and rank else 1.0,
                          nonfinite_loss=nan and rank == 1, digest=digests[rank]),
            )  # fmt: skip
            if got is not None:
                kinds = [a["kind"] for a in got.alarms]
                for a in got.alarms:
                    planner.decide(a)
        return kinds

    assert check(0, 0) == [] and check(0, 1, nan=True) == ["nonfinite"] and check(0, 2, nan=True) == []
    assert check(1, 0, nan=True) == ["nonfinite"]  # back in the new attempt: alarmed again
    assert check(2, 0, digests=("a", "b")) == ["divergence"] and check(2, 1, digests=("a", "b")) == []
    assert check(3, 0, digests=("a", "b")) == ["divergence"]
    assert planner.taken == 4


def test_a_stop_reaches_the_next_attempt_and_is_recorded_done_only_when_the_fit_stopped():
    from ray_ormas._internal.head.fleet_actions import FleetActions

    for stopped in (False, True):
        written: list[dict] = []
        acts = FleetActions(FleetSettings(actions={"nonfinite": "stop"}), lines_into(written))
        acts.on_alarms([alarm("nonfinite")])
        # The controller's wait for the ledger timed out and Ray restarted the group: the new
        # attempt's ranks read the stop at their first check.
        assert acts.order_for(0).action == acts.order_for(1).action == "stop"
        acts.finished(stopped)
        outcome = written[-1]
        if stopped:
            assert (outcome["outcome"], outcome["reason"]) == ("done", "the fit ended with FleetStopError")
        else:
            assert outcome["outcome"] == "not carried out", outcome


def test_a_restart_nobody_ordered_resumes_where_ray_would_and_a_gone_choice_is_said(tmp_path):
    # A divergence that only logs leaves the later checkpoints alone: a worker failure's restart
    # resumes from Ray's latest. A reattempt after damage chooses an earlier checkpoint; when it
    # is gone from storage (num_to_keep deleted it), the restart resumes from Ray's latest, and
    # the action's line says so: no retry loop.
    from ray.train import Checkpoint

    from ray_ormas._internal.head.fleet_actions import FleetActions

    kept = [tmp_path / f"checkpoint_{step}" for step in (10, 20)]
    for folder in kept:
        folder.mkdir()
    written: list[dict] = []
    acts = FleetActions(FleetSettings(actions={"nonfinite": "reattempt"}), lines_into(written))
    acts.book.checked(0, 10, clean=True)
    acts.book.taken(10, 0, Checkpoint(str(kept[0])))
    acts.book.checked(0, 15, clean=False)  # a divergence at run step 15, only logged
    acts.book.taken(20, 0, Checkpoint(str(kept[1])))
    assert acts.resume_from() is None  # nobody ordered a restart: Ray's latest (20)
    acts.on_alarms([alarm("nonfinite", run_step=25)])  # damage: back to the clean checkpoint at 10
    assert written[-1]["checkpoint_run_step"] == 10
    assert acts.resume_from().path == str(kept[0])
    kept[0].rmdir()  # num_to_keep deleted it before the restart loaded it
    assert acts.resume_from() is None
    assert "is gone from storage" in written[-1]["reason"] and "resumes from Ray's latest" in written[-1]["reason"]
    acts.attempt_started(1, 20)
    assert (written[-1]["resumed_run_step"], written[-1]["resumed_from"]) == (20, str(kept[1]))


def test_a_chosen_checkpoint_outlives_num_to_keep_until_the_restart_has_loaded_it(tmp_path):
    # While a check is not clean, the checkpoint a restart after damage would resume from is
    # copied into the record's storage (on the pin thread); Ray's num_to_keep then deletes the
    # original as suspect checkpoints come; the reattempt resumes from the copy, says so, and the
    # copy is gone when the fit ends. Without a restart after damage configured, nothing is copied.
    from ray.train import Checkpoint

    from ray_ormas._internal.head.checkpoint_pins import CheckpointPins
    from ray_ormas._internal.head.fleet_actions import FleetActions
    from ray_ormas._internal.record.store import RecordStore

    def checkpoint(step: int) -> Checkpoint:
        folder = tmp_path / "run" / f"checkpoint_{step}"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(bytes([step]) * 1000)
        (folder / "extra").mkdir()
        (folder / "extra" / "state.json").write_text(f'{{"step": {step}}}')
        return Checkpoint(str(folder))

    store = RecordStore.at(str(tmp_path / "run" / "ormas"))
    quiet = FleetActions(
        FleetSettings(actions={"straggler": "reattempt"}), lines_into([]), pins=CheckpointPins(store, "quiet")
    )
    written: list[dict] = []
    pins = CheckpointPins(store, "fit")
    acts = FleetActions(FleetSettings(actions={"nonfinite": "reattempt"}), lines_into(written), pins=pins)
    for fleet in (quiet, acts):
        fleet.checked(0, 10, clean=True)
    ten = checkpoint(10)
    for fleet in (quiet, acts):
        fleet.taken(10, 0, ten)
        fleet.checked(0, 15, clean=False)  # a NaN at run step 15: checkpoint 10 is the one to keep
    acts._pinning.submit(lambda: None).result(timeout=60)  # the pin thread has done what it was given
    quiet._pinning.submit(lambda: None).result(timeout=60)
    assert not (tmp_path / "run" / "ormas" / ".pinned" / "quiet").exists()
    copy = tmp_path / "run" / "ormas" / ".pinned" / "fit" / "checkpoint_10"
    assert (copy / "model.pt").read_bytes() == bytes([10]) * 1000
    assert (copy / "extra" / "state.json").read_text() == '{"step": 10}'
    for step in (20, 30):  # suspect ones come; num_to_keep=2 deletes checkpoint 10
        acts.taken(step, 0, checkpoint(step))
    shutil.rmtree(ten.path)
    acts.on_alarms([alarm("nonfinite", run_step=30)])
    assert written[-1]["checkpoint_run_step"] == 10
    resumed = acts.resume_from()
    assert resumed.path == str(copy) and (Path(resumed.path) / "model.pt").exists()
    said = written[-1]["reason"]
    assert f"{ten.path}, was deleted" in said and f"resumes from the copy kept at {copy}" in said
    acts.attempt_started(1, 10)
    assert (written[-1]["resumed_run_step"], written[-1]["resumed_from"]) == (10, str(copy))
    acts.finished()
    assert not copy.parent.exists()


def test_a_fleet_record_of_a_version_this_ray_ormas_does_not_read_is_said_not_misread(tmp_path):
    from ray_ormas._internal.record.fleet_record import read_fleet
    from ray_ormas._internal.record.store import RecordStore
    from ray_ormas.errors import RecordStorageError

    store = RecordStore.at(str(tmp_path / "ormas"))
    folder = tmp_path / "ormas" / "fleet" / "fit"
    folder.mkdir(parents=True)
    line = ray_ormas.FleetAlarm("straggler", "slow", attempt=0, ranks=(1,), node="n1").to_line()
    (folder / "alarms.jsonl").write_text(json.dumps(line) + "\n")
    (folder / "fleet.json").write_text('{"format": "ray-ormas-fleet"}')  # before the version: 1
    assert read_fleet(store, "fit")[2] == [line]
    assert line == {"attempt": 0, "check": None, "step": None, "run_step": None, "kind": "straggler", "ranks": [1],
                    "node": "n1", "message": "slow", "time": 0.0}  # fmt: skip
    (folder / "fleet.json").write_text('{"format": "ray-ormas-fleet", "version": 3}')
    with pytest.raises(RecordStorageError, match="has version 3, which this ray-ormas does not read"):
        read_fleet(store, "fit")


def test_every_rank_of_an_attempt_resumes_from_the_same_checkpoint_whenever_it_asks(tmp_path):
    # A restart after a NaN chose the clean checkpoint at run step 10, not Ray's latest (20). Rank 0
    # asks, loads it and starts training, which ends the restart on the head; rank 1 asks only
    # then. Both must get step 10: ranks that start from different checkpoints run different
    # steps and wait on each other's collectives forever (seen once in the Tune trial). A later
    # attempt asks afresh.
    import asyncio

    from ray.train import Checkpoint

    from ray_ormas._internal.head.fleet_head import FleetSpec
    from ray_ormas._internal.head.ledger import Ledger
    from ray_ormas._internal.record.store import RecordStore

    folders = [tmp_path / f"checkpoint_{step}" for step in (10, 20)]
    for folder in folders:
        folder.mkdir()
    settings = FleetSettings(ray_metrics=False, actions={"nonfinite": "reattempt"})
    ledger = Ledger(None, FleetSpec(settings, RecordStore.at(str(tmp_path / "ormas")), "fit", "run", 2, "ddp"))
    acts = ledger._fleet._actions
    acts.checked(0, 10, clean=True)
    acts.taken(10, 0, Checkpoint(str(folders[0])))
    acts.checked(0, 15, clean=False)
    acts.taken(20, 0, Checkpoint(str(folders[1])))
    acts.on_alarms([alarm("nonfinite", run_step=15)])
    assert ledger.resume_from("attempt-1").path == str(folders[0])  # rank 0
    acts.attempt_started(1, 10)  # rank 0 trains: the restart is done on the head
    assert acts.resume_from() is None  # asked now without the attempt, the answer would be Ray's latest
    assert ledger.resume_from("attempt-1").path == str(folders[0])  # rank 1: the same
    assert ledger.resume_from("attempt-2") is None  # a later attempt, nobody ordered it: Ray's latest
    asyncio.run(ledger.finish_fleet())
