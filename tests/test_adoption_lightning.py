"""A LightningModule trained through `ray.train.lightning` under RayOrmasTrainer, unchanged (lightning.py)."""

from __future__ import annotations

import math

import pytest
from ray.train import RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer

from .test_adoption import (
    a_nan_on_rank_1_is_named,
    check_one_record_one_run_and_the_fleet,
    diary,
    digits_dataset,
    events,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


def quickstart_loop():
    """Ray's quickstart loop, imported only when a test runs it (Lightning takes seconds to import)."""
    from .lightning_quickstart import lightning_train_func

    return lightning_train_func


@pytest.mark.timeout(300)
def test_a_lightning_module_on_ray_gets_ormas_monitors_own_callback_on_every_rank(storage):
    trainer = RayOrmasTrainer(
        quickstart_loop(),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="lightning", storage_path=str(storage)),
        repair=True,
        check_every=2,
        verbose=False,
    )
    result = trainer.fit()
    run = result.ormas
    link = check_one_record_one_run_and_the_fleet(result, "ImageClassifier")
    assert link["attached"]["by"] == "ormas-monitor's Lightning callback" and link["step_offset"] == 0
    assert {e["layer"] for e in events(run.record_dir, "certificate")} == {"model.conv2.0", "model.conv3.0"}
    assert {e["layer"] for e in events(run.record_dir, "repair")} == {"model.conv2.0", "model.conv3.0"}
    # Ray's RayTrainReportCallback reports once per epoch through ray.train.report: each of those
    # reports carries the record's facts and its checkpoint the record pointer.
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["user", "user", "final"]
    per_epoch = math.ceil(math.ceil(len(digits_dataset()) / 2) / 64)
    assert result.metrics["step"] == 2 * per_epoch == run.final["ormas/steps_per_rank"][0]
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    assert pointer["run_steps"] == 2 * per_epoch
    assert diary(run.record_dir)[pointer["events"] - 1]["hash"] == pointer["last_hash"]


@pytest.mark.timeout(300)
def test_the_lightning_quickstart_gives_the_fleet_each_ranks_loss_and_a_nan_on_one_rank_is_named(storage):
    from .lightning_quickstart import lightning_train_func_nan_on_rank_1

    a_nan_on_rank_1_is_named(lightning_train_func_nan_on_rank_1, storage, "lightning-nan", step=4)
