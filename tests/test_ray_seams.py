"""The seam with Ray (ray_ormas/_internal/seams/ray_train.py): each private piece ray-ormas relies
on works with the installed Ray, and a Ray release that changes it (simulated here by changing
Ray's own constant or class, as a release would) fails loudly, naming the piece and what changed.
The report seam's own test, with the route it guards, is in test_adoption.py."""

from __future__ import annotations

import importlib
import logging
import os

import pytest

from ray_ormas import RaySeamChanged
from ray_ormas._internal.driver.failures import one_line
from ray_ormas._internal.seams import ray_train


@pytest.fixture(autouse=True)
def fresh_checks():
    """The checks are cached per process: each test sees them run."""
    for check in (
        ray_train.head_node_resource,
        ray_train.job_config_env,
        ray_train.check_nccl_hang_env,
        ray_train._say_format_changed,
        ray_train.print_patch_env,
        ray_train.poll_interval_env,
        ray_train._say_once,
    ):
        check.cache_clear()
    yield
    for check in (
        ray_train.head_node_resource,
        ray_train.job_config_env,
        ray_train.check_nccl_hang_env,
        ray_train._say_format_changed,
        ray_train.print_patch_env,
        ray_train.poll_interval_env,
        ray_train._say_once,
    ):
        check.cache_clear()


def test_each_piece_matches_the_installed_ray():
    assert ray_train.report_seam().TrainFnUtils is not None
    assert ray_train.head_node_resource() == "node:__internal_head__"
    assert ray_train.job_config_env() == "RAY_JOB_CONFIG_JSON_ENV_VAR"
    ray_train.check_nccl_hang_env()
    assert ray_train.print_patch_env() == "RAY_TRAIN_ENABLE_PRINT_PATCH"
    assert ray_train.poll_interval_env() == "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
    ray_train.check_drain_seam()
    ray_train.controller_callback_class.cache_clear()
    assert ray_train.controller_callback_class().__name__ == "ControllerCallback"


def test_a_changed_worker_group_hook_or_node_label_fails_loudly(monkeypatch):
    from ray_ormas._internal.head.placement_callback import merged_selector, node_exclusion_callback

    callback_module = importlib.import_module(ray_train.CONTROLLER_CALLBACK[0])
    hook = callback_module.ControllerCallback.on_controller_start_worker_group

    def renamed(self, *, scaling_config, workers):  # a release that renamed a keyword
        return None

    monkeypatch.setattr(callback_module.ControllerCallback, "on_controller_start_worker_group", renamed)
    ray_train.controller_callback_class.cache_clear()
    with pytest.raises(RaySeamChanged, match=r"keeps a run's later worker groups off an evicted node.*takes"):
        node_exclusion_callback(ledger=None)
    monkeypatch.setattr(callback_module.ControllerCallback, "on_controller_start_worker_group", hook)
    monkeypatch.setattr(importlib.import_module("ray.util.placement_group"), "NODE_ID_LABEL_KEY", "ray.io/node")
    ray_train.controller_callback_class.cache_clear()
    with pytest.raises(RaySeamChanged, match="a node's id label is 'ray.io/node', not 'ray.io/node-id'"):
        node_exclusion_callback(ledger=None)
    monkeypatch.undo()
    ray_train.controller_callback_class.cache_clear()
    # The exclusion joins the selector the user gave; one it cannot join with is left as it was.
    assert merged_selector({"zone": "a"}, ["n2", "n1"]) == {"zone": "a", "ray.io/node-id": "!in(n1,n2)"}
    assert merged_selector([{"zone": "a"}, {"zone": "a"}], ["n1"]) == {"zone": "a", "ray.io/node-id": "!in(n1)"}
    assert merged_selector([{"zone": "a"}, {"zone": "b"}], ["n1"]) is None
    assert merged_selector({"ray.io/node-id": "n3"}, ["n1"]) is None


def test_a_gone_drain_call_or_reason_fails_loudly(monkeypatch):
    raylet = importlib.import_module("ray._raylet")
    monkeypatch.setattr(raylet, "InnerGcsClient", type("InnerGcsClient", (), {}))
    ray_train._drain_pieces.cache_clear()
    with pytest.raises(RaySeamChanged, match=r"evicts a node.*InnerGcsClient.drain_node, which GcsClient forwards"):
        ray_train.check_drain_seam()
    monkeypatch.undo()
    ray_train._drain_pieces.cache_clear()
    monkeypatch.setattr(ray_train, "DRAIN_REASONS", ("ray.core.generated.autoscaler_pb2", "DrainNodeReason", "GONE"))
    with pytest.raises(RaySeamChanged, match="DrainNodeReason has no GONE"):
        ray_train.check_drain_seam()
    ray_train._drain_pieces.cache_clear()


def test_a_renamed_or_unpropagated_poll_interval_variable_fails_loudly(monkeypatch):
    constants = importlib.import_module(ray_train.TRAIN_CONSTANTS_MODULE)
    monkeypatch.setattr(constants, "HEALTH_CHECK_INTERVAL_S_ENV_VAR", "RAY_TRAIN_POLL_S")
    with pytest.raises(RaySeamChanged, match=r"controller polls.*reads 'RAY_TRAIN_POLL_S', not"):
        ray_train.poll_interval_env()
    monkeypatch.undo()
    ray_train.poll_interval_env.cache_clear()
    propagated = constants.ENV_VARS_TO_PROPAGATE - {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"}
    monkeypatch.setattr(constants, "ENV_VARS_TO_PROPAGATE", propagated)
    with pytest.raises(RaySeamChanged, match="no longer propagates RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"):
        ray_train.poll_interval_env()


def test_a_renamed_print_patch_variable_fails_loudly(monkeypatch):
    constants = importlib.import_module(ray_train.TRAIN_CONSTANTS_MODULE)
    monkeypatch.setattr(constants, "ENABLE_PRINT_PATCH_ENV_VAR", "RAY_TRAIN_PATCH_PRINT")
    with pytest.raises(RaySeamChanged, match=r"print patch.*reads 'RAY_TRAIN_PATCH_PRINT', not"):
        ray_train.print_patch_env()


def test_ray_trains_per_report_line_is_hidden_and_nothing_else(caplog, monkeypatch):
    context = importlib.import_module(ray_train.REPORT_LOG_MODULE)
    monkeypatch.setattr(context.logger, "filters", [])  # this test's filter goes with it
    assert ray_train.hide_report_lines() and ray_train.hide_report_lines()  # installed once
    assert len(context.logger.filters) == 1
    with caplog.at_level(logging.INFO):
        context.logger.info("Reporting training result 3: TrainingReport(metrics={'loss': 1.0}) from rank 1")
        context.logger.info("Checkpoint successfully created at: Checkpoint(...)")
        context.logger.warning("Reporting training result 4 took long")
    assert [r.getMessage()[:24] for r in caplog.records] == ["Checkpoint successfully ", "Reporting training resul"]
    assert caplog.records[-1].levelno == logging.WARNING


def test_a_gone_report_logger_is_said_once_and_changes_nothing(caplog, monkeypatch):
    context = importlib.import_module(ray_train.REPORT_LOG_MODULE)
    monkeypatch.delattr(context, "logger")
    with caplog.at_level(logging.WARNING, logger="ray_ormas.seams"):
        assert ray_train.hide_report_lines() is False
        assert ray_train.hide_report_lines() is False
    [said] = [r.getMessage() for r in caplog.records]
    assert "cannot be hidden" in said and "ray==2.60.0" in said


def test_a_renamed_head_node_resource_fails_loudly(monkeypatch):
    constants = importlib.import_module("ray._common.constants")
    monkeypatch.setattr(constants, "HEAD_NODE_RESOURCE_NAME", "node:__head__")
    with pytest.raises(RaySeamChanged, match=r"keeps the run ledger on the head node.*'node:__head__'.*pip install"):
        ray_train.head_node_resource()


def test_a_renamed_job_variable_fails_loudly(monkeypatch):
    constants = importlib.import_module("ray._private.runtime_env.constants")
    monkeypatch.setattr(constants, "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_JOB_CONFIG")
    with pytest.raises(RaySeamChanged, match=r"ray job submit.*sets 'RAY_JOB_CONFIG', not"):
        ray_train.job_config_env()


def test_a_gone_or_renamed_nccl_variable_fails_loudly(monkeypatch):
    constants = importlib.import_module(ray_train.TRAIN_CONSTANTS_MODULE)
    monkeypatch.setattr(constants, "NCCL_RAS_ACTION_ENV_VAR", "RAY_TRAIN_NCCL_HANG_ACTION")
    with pytest.raises(RaySeamChanged, match=r"NCCL hang detector.*reads 'RAY_TRAIN_NCCL_HANG_ACTION'"):
        ray_train.check_nccl_hang_env()
    monkeypatch.delattr(constants, "NCCL_RAS_ACTION_ENV_VAR")
    ray_train.check_nccl_hang_env.cache_clear()
    with pytest.raises(RaySeamChanged, match=r"NCCL_RAS_ACTION_ENV_VAR is gone"):
        ray_train.check_nccl_hang_env()


def test_a_remote_traceback_gives_its_last_error_line_and_a_changed_format_is_said(caplog):
    text = (
        "The actor died because of an error raised in its creation task, ray::Boom.__init__()\n"
        'Traceback (most recent call last):\n  File "boom.py", line 3, in __init__\n'
        '    raise ValueError("no data at /data/x")\nValueError: no data at /data/x'
    )
    assert ray_train.remote_error_line(text) == "ValueError: no data at /data/x"
    assert one_line(RuntimeError(text)) == "ValueError: no data at /data/x"
    assert ray_train.remote_error_line("ValueError: one line") is None
    changed = text.replace("ValueError: no data at /data/x", "(the error was: no data)")
    with caplog.at_level(logging.WARNING, logger="ray_ormas.seams"):
        assert ray_train.remote_error_line(changed) is None
        assert ray_train.remote_error_line(changed) is None
    [said] = [r.getMessage() for r in caplog.records]
    assert "Ray's error text changed" in said and "ray==2.60.0" in said
    assert "(the error was: no data)" in one_line(RuntimeError(changed))


def test_a_fit_polls_every_half_second_unless_the_user_set_the_interval(monkeypatch):
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    from ray_ormas._internal.driver.trainer import _environment, _poll_interval

    name = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
    monkeypatch.delenv(name, raising=False)
    with _environment(_poll_interval()):
        assert get_env_vars_to_propagate()[name] == "0.5"  # what Ray hands the controller
    assert name not in os.environ
    monkeypatch.setenv(name, "3")
    with _environment(_poll_interval()):
        assert get_env_vars_to_propagate()[name] == "3"  # the user's own value wins
    assert os.environ[name] == "3"
