"""The head's hang watch (fleet/stall.py) on a clock the test drives: no Ray."""

from __future__ import annotations

from ray_ormas._internal.fleet.stall import DERIVED_FACTOR, DERIVED_FLOOR_S, WARM_UP_FLOOR_S, StallWatch


def test_a_stall_after_a_check_is_one_alarm_naming_who_reached_it_and_who_did_not():
    watch = StallWatch(hang_after_s=5, world=3)
    watch.attempt_started(0, 3)
    for rank in range(3):
        watch.reached(0, rank, 0, now=10.0)
    watch.reached(0, 0, 1, now=11.0)
    watch.reached(0, 2, 1, now=11.2)
    assert watch.poll(now=15.9) is None
    alarm = watch.poll(now=16.1)
    assert alarm is not None and alarm["kind"] == "hang" and alarm["check"] == 1
    assert alarm["ranks"] == [1] and alarm["reached"] == [0, 2]
    assert "ranks 0, 2 reached check 1, ranks 1 did not" in alarm["message"] and "bound is 5 s" in alarm["message"]
    assert watch.poll(now=100.0) is None  # one alarm per stall
    watch.reached(0, 1, 1, now=101.0)
    watch.reached(0, 0, 2, now=101.5)  # a new check ends the stall; the next one alarms again
    assert watch.poll(now=106.6)["check"] == 2


def test_nothing_is_watched_before_the_first_check_between_attempts_or_after_the_loop():
    watch = StallWatch(hang_after_s=1, world=2)
    watch.attempt_started(0, 2)
    assert watch.poll(now=1e6) is None  # building the model and loading data take what they take
    watch.reached(0, 0, 0, now=0.0)
    watch.attempt_ended()
    assert watch.poll(now=50.0) is None
    watch.attempt_started(1, 2)
    assert watch.poll(now=60.0) is None
    watch.reached(1, 0, 0, now=60.0)
    watch.reached(1, 1, 0, now=60.0)
    watch.winding_down()
    assert watch.poll(now=100.0) is None


def test_when_every_rank_waits_all_are_named_as_reaching_the_last_check():
    watch = StallWatch(hang_after_s=2, world=2)
    watch.attempt_started(0, 2)
    watch.reached(0, 0, 3, now=-1.0)
    watch.reached(0, 1, 4, now=0.0)
    watch.reached(0, 0, 4, now=0.1)
    alarm = watch.poll(now=3.0)
    assert alarm["ranks"] == [0, 1] and "none has reached a later one" in alarm["message"]


def test_the_derived_bound_follows_the_runs_own_pace_above_a_floor():
    watch = StallWatch(world=1)
    watch.attempt_started(0, 1)
    watch.reached(0, 0, 0, now=0.0)
    assert watch.bound_s() == DERIVED_FLOOR_S
    watch.reached(0, 0, 1, now=100.0)  # the warm-up: slow, and not the run's pace
    assert watch.bound_s() == DERIVED_FLOOR_S
    watch.reached(0, 0, 2, now=130.0)  # a slow run: 30 s between checks
    assert watch.bound_s() == DERIVED_FACTOR * 30.0
    assert watch.poll(now=130.0 + DERIVED_FACTOR * 30.0 - 1) is None
    assert watch.poll(now=130.0 + DERIVED_FACTOR * 30.0 + 1)["kind"] == "hang"


def test_between_an_attempts_first_check_and_its_second_the_bound_is_never_below_the_warm_up_floor():
    # The first steps after a (re)start are slow (first backward passes, autotuning, compilation,
    # a node busy starting the group): a stall there is named after the floor, not the bound.
    watch = StallWatch(hang_after_s=4, world=2)
    watch.attempt_started(0, 2)
    watch.reached(0, 0, 0, now=0.0)
    watch.reached(0, 1, 0, now=0.1)
    assert watch.bound_s() == WARM_UP_FLOOR_S
    assert watch.poll(now=12.0) is None  # a warm-up of 12 s on a busy node is no hang
    alarm = watch.poll(now=WARM_UP_FLOOR_S + 0.5)  # a rank stuck there is still named
    assert alarm["ranks"] == [0, 1] and "the attempt's warm-up" in alarm["message"]
    watch.reached(0, 0, 1, now=130.0)
    assert watch.bound_s() == 4 and watch.poll(now=133.0) is None
    assert "the attempt's warm-up" not in watch.poll(now=134.5)["message"]
    watch.attempt_ended()
    watch.attempt_started(1, 2)  # a restarted group warms up again
    watch.reached(1, 0, 6, now=200.0, step=0)
    assert watch.bound_s() == WARM_UP_FLOOR_S


def test_a_rank_of_a_new_attempt_starts_that_attempt():
    watch = StallWatch(hang_after_s=1, world=2)
    watch.attempt_started(0, 2)
    watch.reached(0, 0, 7, now=0.0)
    watch.reached(1, 0, 0, now=5.0)  # attempt 1's first check, before its start was said
    assert watch.poll(now=6.5) is None  # its warm-up
    alarm = watch.poll(now=5.0 + WARM_UP_FLOOR_S + 0.5)
    assert alarm["attempt"] == 1 and alarm["check"] == 0 and alarm["ranks"] == [1]


def test_an_attempt_said_after_its_first_check_keeps_what_was_reached():
    watch = StallWatch(hang_after_s=1, world=4)
    watch.reached(0, 1, 0, now=0.0, step=0)
    watch.attempt_started(0, 2)  # rank 0's word on the attempt comes after rank 1's first facts
    alarm = watch.poll(now=WARM_UP_FLOOR_S + 0.5)
    assert alarm["ranks"] == [0] and alarm["reached"] == [1] and alarm["step"] == 0
