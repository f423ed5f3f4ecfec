"""A LightningModule trained through `ray.train.lightning` under RayOrmasTrainer, unchanged (lightning.py)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import ray.train.lightning
import torch
from ray.train import RunConfig, ScalingConfig
from torch.utils.data import DataLoader

from ray_ormas import RayOrmasTrainer

from .test_adoption import check_one_record_one_run_and_the_fleet, diary, digits_dataset, events, lesioned_cnn

pytestmark = pytest.mark.usefixtures("ray_cluster")


# Ray Train's Lightning quickstart ("Get Started with Distributed Training using PyTorch
# Lightning"), unchanged but for the model and the data.


class ImageClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = lesioned_cnn()
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        outputs = self.forward(x)
        loss = self.criterion(outputs, y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=0.001)


def lightning_train_func():
    # Data
    train_data = digits_dataset()
    train_dataloader = DataLoader(train_data, batch_size=64, shuffle=True)

    # Training
    model = ImageClassifier()
    # [1] Configure PyTorch Lightning Trainer.
    trainer = pl.Trainer(
        max_epochs=2,
        devices="auto",
        accelerator="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
        # [1a] Optionally, disable the default checkpointing behavior
        # in favor of the `RayTrainReportCallback` above.
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_dataloader)


@pytest.mark.timeout(300)
def test_a_lightning_module_on_ray_gets_ormas_monitors_own_callback_on_every_rank(storage):
    trainer = RayOrmasTrainer(
        lightning_train_func,
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
