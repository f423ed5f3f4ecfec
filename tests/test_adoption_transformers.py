"""A Transformers `Trainer` through `ray.train.huggingface.transformers` under RayOrmasTrainer,
unchanged (transformers.py)."""

from __future__ import annotations

import pytest

from .test_adoption import (
    adopted_fit,
    check_one_record_one_run_and_the_fleet,
    check_the_fleet_names_rank_1s_nan,
    last_check,
    per_epoch,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def transformers_fit(ray_cluster, tmp_path_factory):
    """Ray's Transformers quickstart unchanged (imported only here: Transformers takes seconds to
    import); rank 1's loss NaN at the monitor's last check (2 epochs, the callback stepping the
    monitor from the first step). The loop's output_dir is relative, as in Ray's example: the
    trainer runs in the fit's storage folder."""
    from .transformers_quickstart import transformers_train_func_nan_on_rank_1

    storage = tmp_path_factory.mktemp("transformers")
    nan_step = last_check(2 * per_epoch())
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(storage)
        return adopted_fit(transformers_train_func_nan_on_rank_1, storage, "transformers", nan_step), nan_step


@pytest.mark.timeout(300)
def test_a_transformers_trainer_on_ray_gets_ormas_monitors_own_callback_on_every_rank(transformers_fit):
    result, _ = transformers_fit
    run = result.ormas
    link = check_one_record_one_run_and_the_fleet(result, "BertForSequenceClassification")
    assert link["attached"]["by"] == "ormas-monitor's Transformers callback"
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["user", "user", "final"]  # RayTrainReportCallback: one per epoch (on_save)
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    assert pointer["run_steps"] == run.final["ormas/steps_per_rank"][0] > 0


@pytest.mark.timeout(300)
def test_the_transformers_quickstart_gives_the_fleet_each_ranks_loss_and_names_a_nan_on_one_rank(transformers_fit):
    result, nan_step = transformers_fit
    check_the_fleet_names_rank_1s_nan(result.ormas.fleet.alarms, result.path, step=nan_step)
