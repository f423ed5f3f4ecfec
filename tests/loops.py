"""Training loops the integration tests run on real Ray workers, steered by their config dict.

Each loop uses the public worker API exactly as a user would: `ray_ormas.prepare_model`,
`ray_ormas.monitor`, `mon.step(loss)` between backward and the optimizer step.
"""
from __future__ import annotations

import os
from typing import Any

import ray.train
import torch
import torch.nn.functional as F

import ray_ormas
from ray_ormas.demo import DigitsCNN, lesion, load_digits


def digits_loop(config: dict[str, Any]) -> dict[str, Any]:
    """DDP training of the digits CNN for `steps` optimizer steps (per rank: `steps_by_rank`).

    Options: lesion (zero conv2, conv3), report_at (steps after which to call ray_ormas.report),
    checkpoint (those reports carry a checkpoint), raise_at (step at which rank `raise_rank`
    raises ValueError), fail_once_marker (rank 0 raises at step 5 unless this file exists, and
    creates it: a failure in the first attempt only), kill_server_at / server_pgid (rank 0 kills
    that process group at that step), sleep_per_step, no_optimizer (monitor without the optimizer), close_in_loop (close the
    monitor inside the loop and check what close() returns on each rank).
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y, _, _ = load_digits(0)
    x, y = x[rank::world], y[rank::world]
    net = DigitsCNN()
    if config.get("lesion"):
        lesion(net)
    model = ray_ormas.prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, None if config.get("no_optimizer") else opt)
    steps = config.get("steps_by_rank", {}).get(str(rank), config.get("steps", 20))
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        if step == config.get("raise_at") and rank in config.get("raise_ranks", [rank]):
            raise ValueError(f"boom at step {step} on rank {rank}")
        if rank == 0 and step == config.get("kill_server_at"):
            import signal                               # the test's MLflow server dies mid-training
            os.killpg(config["server_pgid"], signal.SIGKILL)
        if config.get("sleep_per_step"):
            import time
            time.sleep(config["sleep_per_step"])
        marker = config.get("fail_once_marker")
        if marker and step == 5 and rank == 0 and not os.path.exists(marker):
            open(marker, "w").close()                   # only the first attempt fails
            raise RuntimeError("injected failure")
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
        if step + 1 in config.get("report_at", []):
            checkpoint = None
            if config.get("checkpoint"):
                import tempfile
                d = tempfile.mkdtemp()
                if rank == 0:
                    torch.save(model.state_dict(), f"{d}/model.pt")
                checkpoint = ray.train.Checkpoint.from_directory(d) if rank == 0 else None
            ray_ormas.report({"user_step": step + 1}, checkpoint=checkpoint)
    out: dict[str, Any] = {"model_type": type(model).__name__,
                           "conv2_abs": float(net.conv2[0].weight.detach().abs().sum()),
                           "conv3_abs": float(net.conv3[0].weight.detach().abs().sum())}
    if config.get("close_in_loop"):
        closed = mon.close()
        if rank != 0 and closed is not None:
            raise AssertionError(f"close() returned {closed!r} on rank {rank}; expected None")
        out["closed"] = str(closed)
    return out


def report_count_loop(config: dict[str, Any]) -> None:
    """No training: rank r calls ray_ormas.report `reports_by_rank[r]` times, then returns."""
    rank = ray.train.get_context().get_world_rank()
    model = ray_ormas.prepare_model(torch.nn.Linear(4, 2))
    ray_ormas.monitor(model, None)
    for i in range(config["reports_by_rank"][str(rank)]):
        ray_ormas.report({"i": i})


def resume_loop(config: dict[str, Any]) -> dict[str, Any]:
    """Epochs over a DistributedSampler, resumable with ray_ormas.save_checkpoint/load_checkpoint.

    Inputs get Gaussian noise from the global torch RNG, so an exact resume needs the random state
    restored too. Options: epochs, kill_rank / kill_at (that rank SIGKILLs itself before global
    step `kill_at`, once: `kill_marker` is created first), sleep_per_step, storage_root +
    storage_check (rank 0 reads the persisted diary through that SubTreeFileSystem root after
    each checkpoint report and returns the line counts it saw).
    """
    import signal
    import time

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y, _, _ = load_digits(0)
    data = TensorDataset(x[:512], y[:512])
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = ray_ormas.prepare_model(DigitsCNN())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, opt)
    state = ray_ormas.load_checkpoint(model, opt, sampler=sampler)
    step = state.step if state else 0
    persisted = []
    for epoch in range(state.epoch + 1 if state else 0, config.get("epochs", 4)):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            marker = config.get("kill_marker")
            if rank == config.get("kill_rank") and step == config.get("kill_at") and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if config.get("sleep_per_step"):
                time.sleep(config["sleep_per_step"])
            loss = F.cross_entropy(model(xb + 0.05 * torch.randn_like(xb)), yb)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)
            opt.step()
            step += 1
        checkpoint = ray_ormas.save_checkpoint(model, opt, epoch=epoch, step=step, sampler=sampler)
        ray_ormas.report({"epoch": epoch, "step": step}, checkpoint=checkpoint)
        if rank == 0 and config.get("storage_check"):
            from pyarrow.fs import LocalFileSystem, SubTreeFileSystem
            fs = SubTreeFileSystem(config["storage_root"], LocalFileSystem())
            with fs.open_input_stream(config["storage_check"]) as f:
                persisted.append(f.read().count(b"\n"))
    return {"step": step, "resumed_from_epoch": state.epoch if state else None, "persisted_lines": persisted}
