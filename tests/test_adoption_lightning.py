"""A LightningModule trained through `ray.train.lightning` under RayOrmasTrainer, unchanged (lightning.py)."""

from __future__ import annotations

import pytest

from .test_adoption import (
    adopted_fit,
    check_one_record_one_run_and_the_fleet,
    check_the_fleet_names_rank_1s_nan,
    diary,
    events,
    last_check,
    per_epoch,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def lightning_fit(ray_cluster, tmp_path_factory):
    """Ray's Lightning quickstart unchanged (imported only here: Lightning takes seconds to import),
    repaired; rank 1's loss NaN at the monitor's last check (2 epochs, the callback stepping the
    monitor from the first step)."""
    from .lightning_quickstart import lightning_train_func_nan_on_rank_1

    storage = tmp_path_factory.mktemp("lightning")
    nan_step = last_check(2 * per_epoch())
    return adopted_fit(lightning_train_func_nan_on_rank_1, storage, "lightning", nan_step, repair=True), nan_step


@pytest.mark.timeout(300)
def test_a_lightning_module_on_ray_gets_ormas_monitors_own_callback_on_every_rank(lightning_fit):
    result, _ = lightning_fit
    run = result.ormas
    link = check_one_record_one_run_and_the_fleet(result, "ImageClassifier")
    assert link["attached"]["by"] == "ormas-monitor's Lightning callback" and link["step_offset"] == 0
    assert {e["layer"] for e in events(run.record_dir, "certificate")} == {"model.conv2.0", "model.conv3.0"}
    assert {e["layer"] for e in events(run.record_dir, "repair")} == {"model.conv2.0", "model.conv3.0"}
    # Ray's RayTrainReportCallback reports once per epoch through ray.train.report: each of those
    # reports carries the record's facts and its checkpoint the record pointer.
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["user", "user", "final"]
    assert result.metrics["step"] == 2 * per_epoch() == run.final["ormas/steps_per_rank"][0]
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    assert pointer["run_steps"] == 2 * per_epoch()
    assert diary(run.record_dir)[pointer["events"] - 1]["hash"] == pointer["last_hash"]


@pytest.mark.timeout(300)
def test_the_lightning_quickstart_gives_the_fleet_each_ranks_loss_and_a_nan_on_one_rank_is_named(lightning_fit):
    result, nan_step = lightning_fit
    check_the_fleet_names_rank_1s_nan(result.ormas.fleet.alarms, result.path, step=nan_step)
