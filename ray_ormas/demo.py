"""`ray-ormas demo`: ormas-monitor's dead-layer experiment, on a local Ray cluster with DDP.

scikit-learn's bundled 8x8 digits images (no download), a small Conv -> BatchNorm -> ReLU CNN,
2 Ray Train workers with DistributedDataParallel (gloo on CPU), three runs from the same seed:

  healthy   trains normally
  watch     conv2 and conv3 zeroed before training; the monitor only watches: it names the dead
            layers and proves (certificate) that they cannot recover
  repair    the same lesion; the monitor repairs the channels it proved dead, identically on every rank

It prints test accuracy, channels repaired and the report paths. The three runs go to one MLflow
store (`<out>/mlflow.db`, experiment `ray-ormas-demo`), and the demo prints the `mlflow ui`
command that shows them side by side. The training loop below is the
whole integration: `ray_ormas.prepare_model`, `ray_ormas.monitor`, `mon.step(loss)`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data

import ray_ormas

logger = logging.getLogger("ray_ormas.demo")

ARMS = ("healthy", "watch", "repair")


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): sklearn's 1,797 digits as 1x8x8 floats in [0, 1]."""
    images, target = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def _digits_arrays() -> tuple[Any, Any]:
    """sklearn's digits (images, target), kept as a NumPy file in the temp folder after the first
    load: importing scikit-learn costs each worker seconds of CPU, reading the copy milliseconds."""
    import importlib.metadata
    import tempfile

    import numpy as np

    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError as e:
        raise SystemExit("the demo needs scikit-learn: pip install 'ray-ormas[demo]'") from e
    cached = Path(tempfile.gettempdir()) / "ray_ormas_cache" / f"digits-sklearn-{version}.npz"
    try:
        with np.load(cached) as saved:
            return saved["images"], saved["target"]
    except Exception:  # none yet, or a damaged copy: built again from scikit-learn
        pass
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    try:
        cached.parent.mkdir(exist_ok=True)
        partial = cached.with_name(f".{cached.stem}.{os.getpid()}.npz")
        np.savez(partial, images=d.images, target=d.target)
        os.replace(partial, cached)
    except OSError as e:  # only the speed-up is lost
        logger.debug("digits not cached at %s: %s", cached, e)
    return d.images, d.target


class DigitsCNN(nn.Module):
    """Three Conv -> BatchNorm -> ReLU blocks and a linear head, for 1x8x8 digits."""

    def __init__(self) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

        self.conv1, self.conv2, self.conv3 = block(1, 16), block(16, 32), block(32, 64)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(64 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.conv2(self.conv1(x)))
        x = self.pool(self.conv3(x))
        return self.head(x.flatten(1))


def lesion(model: DigitsCNN) -> None:
    """ormas-monitor's 'dead' lesion: zero the filters and biases of conv2 and conv3."""
    with torch.no_grad():
        for blk in (model.conv2, model.conv3):
            blk[0].weight.zero_()
            blk[0].bias.zero_()


@torch.no_grad()
def cnn(lesioned: bool = False) -> DigitsCNN:
    """The demo's CNN, optionally with conv2 and conv3 zeroed (a `ray-ormas train` model factory)."""
    net = DigitsCNN()
    if lesioned:
        lesion(net)
    return net


def datasets(seed: int = 0) -> dict[str, torch.utils.data.TensorDataset]:
    """{'train', 'val'}: the digits as (image, label) pairs (a `ray-ormas train` data factory)."""
    x_train, y_train, x_test, y_test = load_digits(seed)
    return {
        "train": torch.utils.data.TensorDataset(x_train, y_train),
        "val": torch.utils.data.TensorDataset(x_test, y_test),
    }


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def train_loop(config: dict[str, Any]) -> dict[str, float]:
    """One Ray Train worker: DDP training of the digits CNN with the monitor attached."""
    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    x_train, y_train, x_test, y_test = load_digits(config["seed"])
    net = DigitsCNN()
    if config["lesion"]:
        lesion(net)
    model = ray_ormas.prepare_model(net)  # 1: DDP, per the trainer
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=1e-2)
    mon = ray_ormas.monitor(model, opt)  # 2: the monitor, every rank
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(
            TensorDataset(x_train, y_train),
            batch_size=config["batch_size"],
            shuffle=True,
            generator=torch.Generator().manual_seed(config["seed"]),
        )
    )
    for epoch in range(config["epochs"]):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)  # 3: after backward
            opt.step()
    return {"test_accuracy": accuracy(model, x_test, y_test)}


@dataclass(frozen=True)
class ArmResult:
    arm: str
    accuracy: float
    channels_repaired: int
    certificates: int
    alarms: int
    stuck_channels: int
    report: Path | None
    seconds: float
    run_page: str | None = None  # the run on one page (run.html at the record's root)


def run(
    out: str | os.PathLike = "ray_ormas_demo",
    epochs: int = 12,
    workers: int = 2,
    check_every: int = 10,
    seed: int = 0,
    lr: float = 3e-3,
    batch_size: int = 32,
    arms: tuple[str, ...] = ARMS,
    verbose: bool = False,
) -> list[ArmResult]:
    """Run the arms on the current Ray cluster (a local one is started if none is) and print the table."""
    import ray
    from ray.train import RunConfig, ScalingConfig

    if not ray.is_initialized():
        logger.info("starting a local Ray cluster (%d workers, gloo on CPU)...", workers)
        ray.init(num_cpus=max(workers, 2), include_dashboard=False, log_to_driver=verbose)
    storage = str(Path(out).resolve())
    store = Path(storage) / "mlflow.db"
    Path(storage).mkdir(parents=True, exist_ok=True)
    tracking = ray_ormas.MLflowSettings(tracking_uri=f"sqlite:///{store}", experiment_name="ray-ormas-demo")
    results = []
    for arm in arms:
        logger.info(
            "--- %s: %s, %s",
            arm,
            "healthy network" if arm == "healthy" else "conv2 and conv3 zeroed",
            "repair on" if arm == "repair" else "watch only",
        )
        t = time.time()
        trainer = ray_ormas.RayOrmasTrainer(
            train_loop,
            train_loop_config={
                "seed": seed,
                "lesion": arm != "healthy",
                "epochs": epochs,
                "lr": lr,
                "batch_size": batch_size,
            },
            repair=arm == "repair",
            check_every=check_every,
            verbose=verbose,
            mlflow=tracking,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name=f"digits-{arm}", storage_path=storage),
        )
        result = trainer.fit()
        assert result.ormas is not None  # fit() always sets it
        final = result.ormas.final
        results.append(
            ArmResult(
                arm=arm,
                accuracy=result.return_value["test_accuracy"],
                channels_repaired=final.get("ormas/channels_repaired", 0),
                certificates=final.get("ormas/certificates", 0),
                alarms=final.get("ormas/alarms", 0),
                stuck_channels=final.get("ormas/stuck_channels", 0),
                report=result.ormas.report,
                seconds=time.time() - t,
                run_page=result.ormas.run_page,
            )
        )
        logger.info("    test accuracy %.1f%% (%.0f s)", results[-1].accuracy, results[-1].seconds)
    print_table(results)
    print(
        f"\nthe three runs side by side in MLflow (experiment ray-ormas-demo):\n"
        f"  mlflow ui --backend-store-uri sqlite:///{_as_typed(store)}"
    )
    return results


def _as_typed(path: Path) -> str:
    """A path under the working directory as a relative one (what a user would type), else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def print_table(results: list[ArmResult]) -> None:
    print("\nDigits CNN, DDP on 2 Ray workers (gloo, CPU); conv2 and conv3 zeroed in 'watch' and 'repair'\n")
    print(f"{'run':<8} {'test acc':>9} {'repaired':>9} {'certif.':>8} {'alarms':>7} {'stuck now':>10}")
    for r in results:
        print(
            f"{r.arm:<8} {r.accuracy:>8.1f}% {r.channels_repaired:>9} {r.certificates:>8} {r.alarms:>7} "
            f"{r.stuck_channels:>10}"
        )
    print("\neach run on one page, to open first (attempts, metrics, the fleet, alarms):")
    for r in results:
        print(f"  {r.arm:<8} {r.run_page}")
    print("\nreports per segment (open in a browser; `ormas-monitor verify <folder>` checks a record):")
    for r in results:
        print(f"  {r.arm:<8} {r.report}")
