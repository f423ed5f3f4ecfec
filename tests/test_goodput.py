"""The goodput account: its arithmetic (record/goodput.py) on timelines as the run ledger keeps
them, with known numbers; its timeline's file; rank 0's step clock; and the account of the
session's shared healthy and killed-and-resumed fits against the loop's own clock, with
`ray-ormas goodput`. The account of the fits the fleet acted on and of the elastic fits is checked
beside their other tests (test_fleet_actions.py, test_elastic.py), the run page's section in
test_run_page.py, the gauges in test_fleet.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

from ray_ormas import open_records
from ray_ormas._internal.head.goodput_keeper import GoodputKeeper, GoodputSpec, failure_cause
from ray_ormas._internal.record.fit_timeline import (
    AttemptTimes,
    ClockReading,
    FitTimeline,
    read_timelines,
    write_timeline,
)
from ray_ormas._internal.record.goodput import BUCKETS, RESIZE, account_of, combined
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.worker.step_clock import StepClock
from ray_ormas.errors import RecordStorageError

from .loops import read_step_log

T0 = 1_800_000_000.0


def reading(steps: int, step_s: float = 0.1, data_s: float = 0.0, monitor_s: float = 0.0, **kw) -> dict:
    """A reading of `steps` steps of `step_s` compute each (the first one 0.5 s longer: warm-up)."""
    compute = steps * step_s + 0.5
    return {
        "elapsed_s": compute + steps * data_s + monitor_s + kw.get("report_s", 0.0),
        "steps": steps,
        "compute_s": compute,
        "data_s": steps * data_s,
        "monitor_s": monitor_s,
        "report_s": kw.get("report_s", 0.0),
        "step_s": step_s,
        "first_steps": 1,
        "first_compute_s": step_s + 0.5,
        "ended": kw.get("ended", False),
        "closing_s": kw.get("closing_s", 0.0),
    }


def healthy() -> FitTimeline:
    """fit() at 0; the first step at 10 s; 100 steps of 0.1 s and 0.02 s of data; the loop ends
    at 23 s, its record closed 0.5 s later; fit() returns at 26 s."""
    r = reading(100, data_s=0.02, monitor_s=0.5, ended=True, closing_s=0.5)
    attempt = AttemptTimes(
        attempt=0, world=2, checked_in=T0 + 8, clock_at=T0 + 10, seen_at=T0 + 24, reading=r, steady_s=0.1
    )
    return FitTimeline("fit", "run", T0, [attempt], closed=T0 + 26, status="FINISHED")


def test_a_healthy_fit_is_cut_into_start_up_productive_data_monitoring_and_wind_down():
    acc = account_of(healthy())
    b = acc.buckets
    assert acc.wall_s == 26 and sum(b.values()) == pytest.approx(26)
    assert b["start_up"] == pytest.approx(10)
    assert b["warm_up"] == pytest.approx(0.5) and b["productive"] == pytest.approx(10.0)
    assert b["data_wait"] == pytest.approx(2.0) and b["monitoring"] == pytest.approx(1.0)  # 0.5 + the close
    assert b["wind_down"] == pytest.approx(26 - 23.5)
    assert b["other"] == pytest.approx(0, abs=1e-9) and not acc.restarts
    assert acc.goodput == pytest.approx(10 / 26)
    assert acc.line().startswith("goodput 38% of 26 s: 10 s to start-up")
    assert json.loads(json.dumps(acc.to_dict()))["buckets"] == pytest.approx(b)
    assert [line.split()[0] for line in acc.table().splitlines()[1:-1]] == list(BUCKETS)


def crashed(failed_steps: int | None) -> FitTimeline:
    """Attempt 0: its first step at 10 s, 40 steps read at 15 s, a rank sees the failure at 15.3 s
    (`failed_steps` in), Ray's controller at 16 s; attempt 1 resumed from run step 30 (a
    checkpoint), its first step at 25 s."""
    a0 = AttemptTimes(
        attempt=0, world=2, clock_at=T0 + 10, seen_at=T0 + 15, reading=reading(40), steady_s=0.1,
        ended_at=T0 + 16, cause="worker failure", error="ActorDiedError: killed", check_every_s=1.0,
        failed_seen_at=T0 + 15.3 if failed_steps is not None else None, failed_steps=failed_steps,
    )  # fmt: skip
    a0.reading["elapsed_s"] = 5.0  # 40 x 0.1, the warm-up, and 0.5 s the clocks could not place
    a1 = AttemptTimes(
        attempt=1, world=2, clock_at=T0 + 25, seen_at=T0 + 30.5, step_offset=30,
        reading=reading(50, ended=True), steady_s=0.1,
    )  # fmt: skip
    return FitTimeline("fit", "run", T0, [a0, a1], closed=T0 + 32, status="FINISHED")


def test_a_worker_failure_costs_the_steps_redone_and_the_restart_from_the_failure_to_the_next_first_step():
    acc = account_of(crashed(failed_steps=43))  # 3 steps after the last check, when rank 1 saw it
    (r,) = acc.restarts
    assert r.cause == "worker failure" and r.lost_steps == 43 - 30 and r.error == "ActorDiedError: killed"
    # 10 steps redone inside the measured span and 3 after it, each at the attempt's mean step (0.1 s)
    assert r.lost_s == pytest.approx(13 * 0.1) and acc.buckets["lost_progress"] == pytest.approx(1.3)
    # The restart: the rest of the tail (1 s - 0.3 s) and from Ray's report to the next first step (9 s)
    assert r.restart_s == pytest.approx(0.7 + 9.0) and acc.buckets["restart"] == pytest.approx(9.7)
    assert acc.restart_by_cause == {"worker failure": pytest.approx(9.7)}
    assert acc.buckets["other"] == pytest.approx(0.5)
    assert sum(acc.buckets.values()) == pytest.approx(acc.wall_s) == 32
    assert [a.attempt for a in acc.attempts] == [0, 1] and acc.attempts[1].began == pytest.approx(T0 + 16)
    # Without a surviving rank's word, the failure's expected place: half a check interval.
    guessed = account_of(crashed(failed_steps=None)).restarts[0]
    assert guessed.lost_s == pytest.approx(1.0 + 0.5) and guessed.restart_s == pytest.approx(0.5 + 9.0)


def test_the_first_steps_data_wait_is_no_part_of_a_redone_step():
    """The first step carries one-offs (0.5 s of set-up before its forward pass, a 0.21 s first
    check): a step redone repeats none of them, and costs the steady step, bucket by bucket."""
    timeline = crashed(failed_steps=40)
    r = timeline.attempts[0].reading
    # 40 steps: 0.1 s compute (the first 0.5 s longer: warm-up), 0.02 s data wait and 0.01 s
    # monitoring each; the first step's data wait is 0.5 s, its monitoring 0.21 s.
    r.update(data_s=0.5 + 39 * 0.02, monitor_s=0.21 + 39 * 0.01, first_step=[0.6, 0.5, 0.21])
    r["elapsed_s"] = r["compute_s"] + r["data_s"] + r["monitor_s"]  # 6.38 s: Ray's controller saw the failure at 17 s
    timeline.attempts[0].ended_at = T0 + 17
    acc = account_of(timeline)
    (restart,) = acc.restarts
    assert restart.lost_steps == 10 and restart.lost_s == pytest.approx(10 * (0.1 + 0.02 + 0.01))
    (a0, _) = acc.attempts
    b = a0.buckets
    assert b["lost_progress"] == pytest.approx(1.3) and b["warm_up"] == pytest.approx(0.5)
    assert b["productive"] == pytest.approx(30 * 0.1) and b["data_wait"] == pytest.approx(0.5 + 29 * 0.02)
    assert b["monitoring"] == pytest.approx(0.21 + 29 * 0.01) and b["other"] == pytest.approx(0, abs=1e-9)
    # A record written before the first step's parts were sent: the attempt's mean step, as before.
    del r["first_step"]
    old = account_of(timeline).restarts[0]
    assert old.lost_s == pytest.approx(10 * (0.1 + (0.5 + 39 * 0.02 + 0.21 + 39 * 0.01) / 40))


def test_a_hang_is_counted_from_the_last_check_to_the_alarm_then_its_action_restarts():
    t = crashed(failed_steps=None)
    t.attempts[0].cause, t.attempts[0].alarm_at = "hang reattempt", T0 + 15.4
    t.attempts[0].ended_at = T0 + 20
    acc = account_of(t)
    assert acc.buckets["hang"] == pytest.approx(0.4)
    assert acc.restarts[0].cause == "hang reattempt" and acc.restarts[0].restart_s == pytest.approx(4.6 + 5.0)
    assert "1 restart (a hang reattempt)" in acc.line()


def test_a_restart_at_another_size_is_an_elastic_resize_and_one_without_a_failure_too():
    t = crashed(failed_steps=43)
    t.attempts[1].world = 1  # the group came back smaller: the failure is kept as the error
    (r,) = account_of(t).restarts
    assert r.cause == RESIZE and r.error == "ActorDiedError: killed"
    grown = crashed(failed_steps=None)
    grown.attempts[0].ended_at = grown.attempts[0].cause = None  # Ray's controller restarted it: no failure
    (r,) = account_of(grown).restarts
    assert r.cause == RESIZE and r.lost_s == 0 and r.restart_s == pytest.approx(25 - 15)


def test_a_fit_that_failed_has_no_restart_and_a_fit_still_running_is_counted_up_to_now():
    t = crashed(failed_steps=43)
    t.attempts = t.attempts[:1]
    t.closed, t.status = T0 + 18, "FAILED"
    acc = account_of(t)
    assert not acc.restarts and acc.buckets["wind_down"] == pytest.approx(0.7 + 2.0)  # after the steps lost
    assert sum(acc.buckets.values()) == pytest.approx(18)
    running = healthy()
    running.closed = None
    live = account_of(running, now=T0 + 30)
    assert not live.closed and live.wall_s == pytest.approx(30)
    nothing = FitTimeline("fit", "run", T0, [], closed=T0 + 5, status="FAILED")
    assert account_of(nothing).buckets["start_up"] == 5


def test_a_whole_run_sums_its_fits():
    run = combined([account_of(healthy()), account_of(crashed(43))])
    assert run is not None and run.fits == 2 and run.wall_s == pytest.approx(58)
    assert run.goodput == pytest.approx((10 + account_of(crashed(43)).buckets["productive"]) / 58)
    assert combined([]) is None


def test_the_timeline_file_round_trips_and_an_unknown_version_is_said(tmp_path):
    store = RecordStore.at(tmp_path / "ormas")
    write_timeline(store, healthy())
    (back,) = read_timelines(store)
    assert account_of(back).buckets == account_of(healthy()).buckets
    path = next((tmp_path / "ormas" / "goodput").iterdir())
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    with pytest.raises(RecordStorageError, match="version 99"):
        read_timelines(store)


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ("ActorDiedError: The actor died because its node has died. Node Id: abc", "node failure"),
        ("WorkerHealthCheckFailedError: A worker health check failed. node_id='abc' pid=9447", "worker failure"),
        ("ActorDiedError: the node was preempted (spot instance reclaimed)", "preemption"),
        ("ValueError: boom at step 7", "worker failure"),
    ],
)
def test_a_failures_cause_is_read_from_its_error(error, cause):
    assert failure_cause(error) == cause


def test_the_keeper_places_the_first_step_by_the_readings_arrival_and_closes_with_the_fit(tmp_path):
    store = RecordStore.at(tmp_path / "ormas")
    keeper = GoodputKeeper(GoodputSpec("fit", store, "run", time.time() - 5.0))
    keeper.attempt(0, 2)
    r = ClockReading(2.0, 10, 1.5, 0.3, 0.1, 0.0, 0.15, 1, 0.4)
    keeper.reading(0, r, step_offset=0)
    times = keeper.timeline.attempts[0]
    assert times.clock_at == pytest.approx(time.time() - 2.0, abs=0.5) and times.steady_s == 0.15
    keeper.rank_failed(0, 12)
    keeper.failed(0, {1: "ValueError: boom"}, None)
    account = keeper.close(time.time(), "FAILED")
    assert account.closed and sum(account.buckets.values()) == pytest.approx(account.wall_s)
    (back,) = read_timelines(store)
    assert (
        back.status == "FAILED" and back.attempts[0].cause == "worker failure" and back.attempts[0].failed_steps == 12
    )


def test_rank_0s_clock_splits_a_step_into_data_compute_monitor_and_report():
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock = StepClock(model, opt, ledger=None, token="t", step_offset=0)
    for _ in range(5):
        time.sleep(0.03)  # the data loader
        loss = model(torch.randn(8, 64)).sum()
        loss.backward()
        clock.step_called()
        time.sleep(0.01)  # the monitor's step
        clock.step_returned(checked=False)
        opt.step()
        time.sleep(0.02)  # a report between steps (its time is said by the session)
        clock.reporting(0.02)
    r = clock.reading()
    assert r.steps == 5 and r.data_s == pytest.approx(5 * 0.03, rel=0.3)
    assert r.monitor_s == pytest.approx(5 * 0.01, rel=0.3) and r.report_s == pytest.approx(4 * 0.02, rel=0.3)
    assert r.compute_s < 5 * 0.02  # what is left: forward and backward of a small layer
    # The first step's own parts, sent apart: a step redone is priced without its one-offs.
    assert r.first_step is not None
    first_compute, first_data, first_monitor = r.first_step
    assert 0 < first_compute <= r.compute_s
    assert first_data == pytest.approx(0.03, rel=0.3) and first_monitor == pytest.approx(0.01, rel=0.3)
    assert r.data_s + r.monitor_s + r.report_s + r.compute_s <= r.elapsed_s
    clock.close()


# ------------------------------------------------------------------ the account of real fits
def test_a_healthy_fits_account_adds_up_to_its_wall_time_and_agrees_with_the_loops_own_clock(healthy_fit):
    """tests/shared_fits.py: 24 steps on 2 workers, each with 0.3 s of sleep before its forward
    pass (the data wait), the loop's own clock of every step in steps.jsonl."""
    account = healthy_fit.result.ormas.goodput
    assert account is not None and account.closed and not account.restarts
    assert sum(account.buckets.values()) == pytest.approx(account.wall_s)
    assert account.wall_s == pytest.approx(healthy_fit.returned - healthy_fit.called, rel=0.02)
    steps = [line for line in read_step_log(healthy_fit.step_log) if "step" in line]
    assert [s["step"] for s in steps] == list(range(24))
    # Start-up: from fit()'s call to the first step (the loop's first iteration), within 10%.
    assert account.buckets["start_up"] == pytest.approx(steps[0]["top"] - healthy_fit.called, rel=0.10)
    # Productive (with the first step's warm-up): the steps' compute, forward to the monitor's
    # step and the optimizer's step after it, as the loop timed them, within 10%.
    compute = sum((s["called"] - s["forward"]) + (s["end"] - s["returned"]) for s in steps)
    assert account.buckets["productive"] + account.buckets["warm_up"] == pytest.approx(compute, rel=0.10)
    # Data wait: from one step's end to the next forward pass (the 0.3 s sleep, mostly), within 10%.
    waits = [b["forward"] - a["end"] for a, b in zip(steps, steps[1:])] + [steps[0]["forward"] - steps[0]["top"]]
    assert account.buckets["data_wait"] == pytest.approx(sum(waits), rel=0.10)
    assert account.buckets["other"] < 0.02 * account.wall_s and account.buckets["checkpoint"] > 0
    # The record's timeline: the whole run, as `ray-ormas goodput` reads it.
    records = open_records(healthy_fit.run_dir)
    (fit,) = records.goodput_per_fit()
    assert fit.buckets == pytest.approx(account.buckets) and records.goodput().fits == 1


def test_a_killed_worker_costs_its_redone_steps_and_the_restart_from_the_kill_to_the_next_first_step(
    killed_and_repaired_fit, capsys
):
    """tests/shared_fits.py: rank 0 SIGKILLs itself before step 20; Ray resumes from a checkpoint
    (run step 16, or 8 when Ray had not registered epoch 1's yet)."""
    account = killed_and_repaired_fit.result.ormas.goodput
    assert account is not None
    log = read_step_log(killed_and_repaired_fit.step_log)
    kill = next(i for i, line in enumerate(log) if "killed" in line)
    before, after = log[:kill], log[kill + 1 :]
    (restart,) = account.restarts
    assert restart.cause == "worker failure" and restart.error
    assert restart.lost_steps == log[kill]["killed"] - after[0]["step"]  # exactly the steps redone
    # The attempt's mean step by the loop's clock: its steps' span, less its checkpoints and reports.
    steps = [line for line in before if "step" in line]
    saved = sum(line["saved"] for line in before if "saved" in line)
    mean_step = (steps[-1]["end"] - steps[0]["end"] - saved) / (len(steps) - 1)
    assert restart.lost_s == pytest.approx(restart.lost_steps * mean_step, rel=0.10)
    assert restart.restart_s == pytest.approx(after[0]["top"] - log[kill]["at"], rel=0.10)
    assert sum(account.buckets.values()) == pytest.approx(account.wall_s)
    assert account.buckets["other"] < 0.02 * account.wall_s
    # `ray-ormas goodput RUN`, as a user types it, on the record alone.
    from ray_ormas._internal.cli.main import main

    assert main(["goodput", str(killed_and_repaired_fit.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 restart (a worker failure)" in out and "restart after attempt 0: worker failure" in out
    assert main(["goodput", str(killed_and_repaired_fit.run_dir), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run"]["restart_by_cause"].keys() == {"worker failure"}


def test_goodput_of_a_record_with_no_timeline_says_so(tmp_path):
    (tmp_path / "run" / "ormas" / "model" / "segment-000").mkdir(parents=True)  # a record an older ray-ormas wrote
    done = subprocess.run(
        [sys.executable, "-m", "ray_ormas", "goodput", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no goodput timeline" in done.stderr, done
