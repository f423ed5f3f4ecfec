"""A Ray Train DDP loop with ormas-monitor on every rank: the three lines, in a complete script.

    python examples/digits_ddp.py --repair --workers 2

Uses scikit-learn's bundled digits images (no download). Prints where rank 0's record and report
are, and rank 0's counts as they came back through ray.train.report.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from ray.train import RunConfig, ScalingConfig
from torch.utils.data import DataLoader, TensorDataset

import ray_ormas
from ray_ormas.demo import DigitsCNN, accuracy, lesion, load_digits


def train_loop(config: dict) -> dict:
    import ray.train.torch

    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = load_digits()
    net = DigitsCNN()
    if config["lesion"]:
        lesion(net)  # zero conv2 and conv3: dead layers to find
    model = ray_ormas.prepare_model(net)  # 1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = ray_ormas.monitor(model, opt)  # 2
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(TensorDataset(x_train, y_train), batch_size=32, shuffle=True)
    )
    for epoch in ray_ormas.epochs(loader, config["epochs"]):  # set_epoch each epoch, at any number of workers
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)  # 3
            opt.step()
        # Your own per-epoch report, with the monitor's facts merged in under "ormas/".
        ray_ormas.report({"epoch": epoch, "train_loss": loss.item()})
    return {"test_accuracy": accuracy(model, x_test, y_test)}


def main(
    workers: int = 2, epochs: int = 4, repair: bool = False, lesioned: bool = True, storage_path: str | None = None
) -> ray_ormas.RayOrmasResult:
    result = ray_ormas.RayOrmasTrainer(
        train_loop,
        train_loop_config={"epochs": epochs, "lesion": lesioned},
        repair=repair,
        check_every=10,
        verbose=False,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=f"digits-example-{'repair' if repair else 'watch'}", storage_path=storage_path),
    ).fit()
    final = result.ormas.final
    print(
        f"test accuracy {result.return_value['test_accuracy']:.1f}%; "
        f"certificates {final['ormas/certificates']}, channels repaired {final['ormas/channels_repaired']}, "
        f"stuck now {final['ormas/stuck_channels']}"
    )
    print(f"record: {result.ormas.record_dir}\nreport: {result.ormas.report}")
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repair", action="store_true")
    p.add_argument("--healthy", action="store_true", help="do not zero conv2 and conv3")
    a = p.parse_args()
    import ray

    ray.init(num_cpus=max(a.workers, 2), include_dashboard=False)
    main(a.workers, a.epochs, a.repair, not a.healthy)
