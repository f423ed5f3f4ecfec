"""A GAN with two monitors, as a loop of your own: `ray-ormas train examples/gan.yaml`.

The generator and the discriminator are wrapped on their own (two DDP models), each with its
own optimizer and its own monitor, so each gets its own record: `ormas/generator/segment-000`
and `ormas/discriminator/segment-000`. The loop gets the whole config as a dict; it reads
`train.epochs` and the per-rank batch size (`ray_ormas.batch_size()`, from `train.batch`).
"""

from __future__ import annotations

from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import ray_ormas
from ray_ormas.demo import load_digits


def generator(noise: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(noise, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 64), nn.Tanh())


def discriminator() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))


def train_loop(config: dict[str, Any]) -> dict[str, float]:
    torch.manual_seed(config["train"]["seed"])
    device = ray.train.torch.get_device()
    x, _, _, _ = load_digits(0)
    real_images = TensorDataset(x.reshape(len(x), -1) * 2 - 1)  # 8x8 digits in [-1, 1]
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(real_images, batch_size=ray_ormas.batch_size(), shuffle=True, drop_last=True)
    )
    gen, disc = ray_ormas.prepare_model(generator()), ray_ormas.prepare_model(discriminator())
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    mon_g = ray_ormas.monitor(gen, opt_g, name="generator")
    mon_d = ray_ormas.monitor(disc, opt_d, name="discriminator")
    bce = nn.BCEWithLogitsLoss()
    for epoch in ray_ormas.epochs(loader, config["train"]["epochs"]):
        for (real,) in loader:
            n = len(real)
            fake = gen(torch.randn(n, 16, device=device))
            # the discriminator's step: real and fake in one forward
            logits = disc(torch.cat([real, fake.detach()]))
            d_loss = bce(logits, torch.cat([torch.ones(n, 1, device=device), torch.zeros(n, 1, device=device)]))
            opt_d.zero_grad()
            d_loss.backward()
            mon_d.step(d_loss)
            opt_d.step()
            # the generator's step, through the discriminator
            g_loss = bce(disc(fake), torch.ones(n, 1, device=device))
            opt_g.zero_grad()
            g_loss.backward()
            mon_g.step(g_loss)
            opt_g.step()
        ray_ormas.report({"epoch": epoch, "d_loss": float(d_loss), "g_loss": float(g_loss)})
    return {"d_loss": float(d_loss), "g_loss": float(g_loss)}
