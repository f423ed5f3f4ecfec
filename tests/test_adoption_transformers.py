"""A Transformers `Trainer` through `ray.train.huggingface.transformers` under RayOrmasTrainer,
unchanged (transformers.py)."""

from __future__ import annotations

import pytest
from ray.train import RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer

from .test_adoption import a_nan_on_rank_1_is_named, check_one_record_one_run_and_the_fleet

pytestmark = pytest.mark.usefixtures("ray_cluster")


def quickstart_loop():
    """Ray's quickstart loop, imported only when a test runs it (Transformers takes seconds to import)."""
    from .transformers_quickstart import transformers_train_func

    return transformers_train_func


@pytest.mark.timeout(300)
def test_a_transformers_trainer_on_ray_gets_ormas_monitors_own_callback_on_every_rank(storage, monkeypatch):
    monkeypatch.chdir(storage)  # the loop's output_dir is relative, as in Ray's example
    trainer = RayOrmasTrainer(
        quickstart_loop(),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="transformers", storage_path=str(storage)),
        check_every=2,
        verbose=False,
    )
    result = trainer.fit()
    run = result.ormas
    link = check_one_record_one_run_and_the_fleet(result, "BertForSequenceClassification")
    assert link["attached"]["by"] == "ormas-monitor's Transformers callback"
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["user", "user", "final"]  # RayTrainReportCallback: one per epoch (on_save)
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    assert pointer["run_steps"] == run.final["ormas/steps_per_rank"][0] > 0


@pytest.mark.timeout(300)
def test_the_transformers_quickstart_gives_the_fleet_each_ranks_loss_and_names_a_nan_on_one_rank(storage, monkeypatch):
    monkeypatch.chdir(storage)  # the loop's output_dir is relative, as in Ray's example
    from .transformers_quickstart import transformers_train_func_nan_on_rank_1

    a_nan_on_rank_1_is_named(transformers_train_func_nan_on_rank_1, storage, "transformers-nan", step=4)
