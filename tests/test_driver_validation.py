"""Everything that can be checked on the driver fails in RayOrmasTrainer(...), before Ray starts."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
import torch
from ormas_monitor import MonitorConfig
from ray.train import RunConfig, ScalingConfig

import ray_ormas
from ray_ormas import MonitorSettings, RayOrmasTrainer


def loop(config):
    pass


def test_valid_trainer_builds_settings_without_starting_ray(tmp_path):
    t = RayOrmasTrainer(
        loop,
        repair=True,
        check_every=7,
        layers="conv*",
        report_every=3,
        monitor_config=MonitorConfig(patience=2),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="x", storage_path=str(tmp_path / "somewhere")),
    )
    assert t.settings.config.check_every == 7 and t.settings.config.patience == 2
    assert t.settings.layers == ("conv*",)
    assert t.store.root == str(tmp_path / "somewhere" / "x" / "ormas") and t.store.is_local
    assert list(tmp_path.iterdir()) == []  # the storage check leaves no trace


def test_the_monitors_settings_as_one_object_are_the_flat_keywords_settings(tmp_path):
    storage = RunConfig(name="x", storage_path=str(tmp_path))
    flat = RayOrmasTrainer(
        loop,
        repair=True,
        check_every=7,
        layers="conv*",
        report_every=3,
        monitor_config=MonitorConfig(patience=2),
        run_config=storage,
    )
    settings = MonitorSettings(
        repair=True, check_every=7, layers=("conv*",), report_every=3, thresholds={"patience": 2}
    )
    assert RayOrmasTrainer(loop, monitor=settings, run_config=storage).settings == flat.settings
    # repair= and check_every= are shortcuts beside it, for a field it leaves at its default.
    shortcut = RayOrmasTrainer(loop, monitor=MonitorSettings(layers=("conv*",)), repair="all", check_every=5)
    assert (shortcut.settings.repair, shortcut.settings.check_every, shortcut.settings.layers) == ("all", 5, ("conv*",))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"monitor": MonitorSettings(repair=True), "repair": "all"}, "repair: given twice, as repair='all' and in"),
        ({"monitor": MonitorSettings(check_every=7), "check_every": 3}, "check_every: given twice"),
        ({"monitor": MonitorSettings(), "layers": "conv*"}, "layers: with monitor=MonitorSettings(...), set layers"),
        ({"monitor": MonitorSettings(), "monitor_config": MonitorConfig(patience=2)}, "set thresholds and check_every"),
        ({"monitor": MonitorSettings(), "verbose": False, "report_every": 2}, "verbose: with monitor="),
    ],
)
def test_a_monitor_field_given_both_ways_is_an_error_naming_it(kwargs, words):
    with pytest.raises(ray_ormas.OptionError, match=re.escape(words)):
        RayOrmasTrainer(loop, **kwargs)


def test_monitor_must_be_a_monitor_settings():
    with pytest.raises(TypeError, match=r"monitor must be a ray_ormas.MonitorSettings"):
        RayOrmasTrainer(loop, monitor={"repair": True})


@pytest.mark.timeout(120)
def test_building_a_trainer_or_refusing_one_starts_no_ray(tmp_path):
    """In a fresh process (this test session's own Ray cluster would hide a start): a valid
    trainer is built and a bad one refused, and Ray was never initialized."""
    code = f"""
import ray, ray_ormas
from ray.train import RunConfig, ScalingConfig
def loop(config):
    pass
ray_ormas.RayOrmasTrainer(loop, repair=True, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="x", storage_path={str(tmp_path)!r}))
try:
    ray_ormas.RayOrmasTrainer(loop, check_every=0)
except ValueError as e:
    print("refused:", e)
print("ray initialized:", ray.is_initialized())
"""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "refused: check_every: Input should be greater than or equal to 1, got 0" in ran.stdout
    assert ran.stdout.strip().endswith("ray initialized: False"), ran.stdout


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"chek_every": 5}, TypeError, "did you mean 'check_every'"),
        ({"strategy": "deepspeed"}, ValueError, "strategy must be one of 'ddp', 'fsdp'"),
        (
            {"strategy": "fsdp", "repair": True, "scaling_config": ScalingConfig(num_workers=2, use_gpu=True)},
            ValueError,
            "repair is not possible with strategy='fsdp'",
        ),
        ({"repair": "yes"}, ValueError, "repair must be False"),
        ({"repair": None}, ValueError, "repair must be False"),
        ({"check_every": 0}, ValueError, "check_every: Input should be greater than or equal to 1, got 0"),
        ({"check_every": 2.5}, ValueError, "check_every: Input should be a valid integer, got 2.5"),
        ({"monitor_config": {"check_every": 5}}, TypeError, "MonitorConfig"),
        ({"monitor_config": MonitorConfig(), "check_every": -1}, ValueError, "check_every"),
        # pydantic's own words ("Tuple" or "Value should have ..." by release: constraints/oldest.txt)
        ({"layers": []}, ValueError, re.compile(r"layers: \w+ should have at least 1 item")),
        ({"layers": ["conv*", 3]}, ValueError, "layers.1: Input should be a valid string, got 3"),
        ({"report_every": 0}, ValueError, "report_every: Input should be greater than or equal to 1, got 0"),
        ({"sync_timeout_s": 0}, ValueError, "sync_timeout_s: Input should be greater than 0, got 0"),
        ({"sync_timeout_s": float("inf")}, ValueError, "sync_timeout_s: Input should be a finite number, got inf"),
        ({"verbose": "loud"}, ValueError, "verbose: Input should be a valid boolean, got 'loud'"),
        ({"scaling_config": {"num_workers": 2}}, TypeError, "ray.train.ScalingConfig"),
        ({"run_config": {"name": "x"}}, TypeError, "ray.train.RunConfig"),
        ({"train_loop_config": [1, 2]}, TypeError, "train_loop_config must be a dict"),
    ],
)
def test_bad_option_fails_on_the_driver(kwargs, error, words):
    pattern = words if isinstance(words, re.Pattern) else re.escape(words)
    with pytest.raises(error, match=pattern):
        RayOrmasTrainer(loop, **kwargs)


def test_loop_with_two_arguments_is_refused():
    def two(a, b):
        pass

    with pytest.raises(TypeError, match="no argument or one"):
        RayOrmasTrainer(two)
    with pytest.raises(TypeError, match="must be a function"):
        RayOrmasTrainer("train.py")


def test_settings_are_frozen_and_reused_by_ormas_monitor():
    s = MonitorSettings.build(repair="all", check_every=3)
    with pytest.raises(AttributeError):
        s.repair = False  # type: ignore[misc]
    kw = s.monitor_kwargs()
    assert kw["repair"] == "all" and kw["config"].check_every == 3
    assert s.to_dict()["config"]["check_every"] == 3


@pytest.mark.parametrize(
    "call",
    [
        lambda: ray_ormas.prepare_model(torch.nn.Linear(2, 2)),
        lambda: ray_ormas.monitor(torch.nn.Linear(2, 2)),
        lambda: ray_ormas.report({"a": 1}),
    ],
)
def test_worker_api_outside_a_trainer_says_what_to_do(call):
    with pytest.raises(RuntimeError, match="only inside a training loop run by RayOrmasTrainer"):
        call()


def test_reserved_metric_names_are_refused_before_the_session_is_needed():
    with pytest.raises(ValueError, match="reserved for ray-ormas"):
        ray_ormas.report({"ormas/loss": 1.0})


def test_workers_print_each_line_once_unless_the_user_says_otherwise(monkeypatch):
    from ray_ormas._internal.driver.trainer import _print_once

    monkeypatch.delenv("RAY_TRAIN_ENABLE_PRINT_PATCH", raising=False)
    assert _print_once(None) == {"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}
    theirs = {"pip": ["x"], "env_vars": {"A": "1"}}
    assert _print_once(theirs) == {"pip": ["x"], "env_vars": {"A": "1", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}
    assert theirs == {"pip": ["x"], "env_vars": {"A": "1"}}  # the user's own dict is not changed
    mine = {"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "1"}}
    assert _print_once(mine) is mine
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PRINT_PATCH", "1")
    assert _print_once(None) is None


def test_a_renamed_print_patch_variable_is_said_and_the_fit_goes_on(monkeypatch, caplog):
    import importlib

    from ray_ormas._internal.driver import trainer
    from ray_ormas._internal.seams import ray_train

    monkeypatch.delenv("RAY_TRAIN_ENABLE_PRINT_PATCH", raising=False)
    constants = importlib.import_module(ray_train.TRAIN_CONSTANTS_MODULE)
    monkeypatch.setattr(constants, "ENABLE_PRINT_PATCH_ENV_VAR", "RAY_TRAIN_PATCH_PRINT")
    ray_train.print_patch_env.cache_clear()
    trainer._say_once.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="ray_ormas"):
            assert trainer._print_once(None) is None and trainer._print_once({"pip": []}) == {"pip": []}
    finally:
        ray_train.print_patch_env.cache_clear()
        trainer._say_once.cache_clear()
    [said] = [r.getMessage() for r in caplog.records]
    assert "print patch" in said and "RAY_TRAIN_PATCH_PRINT" in said


def test_every_settings_class_refuses_a_bad_value_with_a_ray_ormas_error():
    # Built as a user builds them, each public settings class with a bad value for each of its
    # options (a value no option takes), one it does not have, and one bound broken: the error is
    # a RayOrmasError (OptionError, a ValueError too) that names the option, never pydantic's own.
    import dataclasses

    from pydantic.dataclasses import is_pydantic_dataclass

    classes = [getattr(ray_ormas, name) for name in ray_ormas.__all__]
    settings = [c for c in classes if isinstance(c, type) and is_pydantic_dataclass(c)]
    assert {c.__name__ for c in settings} >= {"MonitorSettings", "MLflowSettings", "FleetSettings", "BatchSize"}
    for cls in settings:
        for field in [*(f.name for f in dataclasses.fields(cls)), "not_an_option"]:
            with pytest.raises(ray_ormas.OptionError, match=rf"{cls.__name__}\.{field}: ") as raised:
                cls(**{field: object()})
            assert isinstance(raised.value, (ray_ormas.RayOrmasError, ValueError)), (cls, field)
    with pytest.raises(ray_ormas.OptionError, match=r"FleetSettings.max_evict_nodes: Input should be greater than"):
        dataclasses.replace(ray_ormas.FleetSettings(), max_evict_nodes=0)
    with pytest.raises(ray_ormas.OptionError, match=r"MLflowSettings.max_pending: Input should be greater than or"):
        ray_ormas.MLflowSettings(max_pending=10)
