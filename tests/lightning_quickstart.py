"""Ray Train's Lightning quickstart, as a user would run it (imported by the tests that
need it, so that collecting the suite does not import Lightning)."""

from __future__ import annotations

import lightning.pytorch as pl
import ray.train.lightning
import torch
from torch.utils.data import DataLoader

from .loops import nan_on_rank
from .test_adoption import digits_dataset, lesioned_cnn

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


def lightning_train_func_nan_on_rank_1(config):
    """The quickstart, unchanged, with rank 1's loss NaN at its step `config["nan_at"]` (the
    callback attaches the monitor at the first step: the loop's forward k is its step k)."""
    nan_on_rank(1, "DigitsCNN", at_forward=config["nan_at"])
    lightning_train_func()
