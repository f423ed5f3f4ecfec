"""GPU check for a machine with CUDA: `python tests/gpu/check_gpu.py` (one command, a few minutes).

What CPU runs cannot show, on every GPU of the machine (world size = GPU count, NCCL):
  1. DDP + `sync_batchnorm=True` on the lesioned digits CNN with repair: SyncBatchNorm layers,
     producer -> SyncBatchNorm pairs, certificates and repairs, identical replicas.
  2. FSDP2 (`strategy="fsdp"`) with bf16 parameters (`MixedPrecisionPolicy`): global gradient
     norms recorded, the record verifies.
  3. fp16 autocast with a CUDA GradScaler given to the monitor: no alarm from scaler overflows.
  4. the pre-flight screen's compute probe on each GPU (a 4096 matmul, known answer, timed with
     CUDA events): its TFLOP/s; with more than one GPU, the DDP run's screen (NCCL exchanges and
     all-reduce) has every rank's row on a CUDA device.
Prints one line per check and exits 1 if any fails, 2 without CUDA. With one GPU the
SyncBatchNorm run has nothing to synchronise (world size 1) and says so. Not part of the CPU
test suite; run it when a GPU machine is available and put the output in the issue note.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F


def ddp_syncbn_loop(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train
    import ray.train.torch

    import ray_ormas
    from ray_ormas.demo import DigitsCNN, lesion, load_digits

    device = ray.train.torch.get_device()
    ctx = ray.train.get_context()
    torch.manual_seed(0)
    x, y, _, _ = load_digits(0)
    x, y = (
        x[ctx.get_world_rank() :: ctx.get_world_size()].to(device),
        y[ctx.get_world_rank() :: ctx.get_world_size()].to(device),
    )
    net = DigitsCNN()
    lesion(net)
    model = ray_ormas.prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, opt)
    for _ in range(config["steps"]):
        idx = torch.randint(0, len(x), (64,), device=device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    return {
        "bn_types": sorted({type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__}),
        "pairs": mon.monitor.pairs,
    }


def fsdp_bf16_loop(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train.torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import ray_ormas
    from examples.transformer import TinyTransformer

    device = ray.train.torch.get_device()
    torch.manual_seed(0)
    model = ray_ormas.prepare_model(
        TinyTransformer(),
        parallel_strategy_kwargs={
            "shard_modules": "encoder.layers.?",
            "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16),
        },
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = ray_ormas.monitor(model, opt)
    for _ in range(config["steps"]):
        seq = (torch.randint(0, 32, (32, 1), device=device) + torch.arange(9, device=device)) % 32
        loss = F.cross_entropy(model(seq[:, :-1]).float().reshape(-1, 32), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    return {"monitor_class": type(mon.monitor).__name__}


def amp_loop(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train.torch

    import ray_ormas
    from ray_ormas.demo import DigitsCNN, load_digits

    device = ray.train.torch.get_device()
    torch.manual_seed(0)
    x, y, _, _ = load_digits(0)
    x, y = x.to(device), y.to(device)
    model = ray_ormas.prepare_model(DigitsCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)  # overflows at first: skipped steps
    mon = ray_ormas.monitor(model, opt, scaler=scaler)
    for _ in range(config["steps"]):
        idx = torch.randint(0, len(x), (64,), device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        scaler.scale(loss).backward()
        mon.step(loss)
        scaler.step(opt)
        scaler.update()
    return {"scale": scaler.get_scale()}


def run(
    name: str, loop: Callable, storage: str, gpus: int, check: Callable[[Any, list[dict]], str | None], **kwargs: Any
) -> bool:
    from ray.train import RunConfig, ScalingConfig

    from ray_ormas import RayOrmasTrainer

    started = time.monotonic()
    try:
        result = RayOrmasTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=gpus, use_gpu=True),
            mlflow=False,
            verbose=False,
            run_config=RunConfig(name=name, storage_path=storage),
            **kwargs,
        ).fit()
        record = result.ormas.record_dir
        events = [json.loads(line) for line in (record / "diary.jsonl").read_text().splitlines()]
        problem = check(result, events)
    except Exception as e:  # a failed check is reported, the others still run
        problem = f"{type(e).__name__}: {e}"
    print(
        f"{'FAIL' if problem else 'ok  '}  {name:<12} {time.monotonic() - started:6.1f} s  {problem or ''}", flush=True
    )
    return problem is None


def preflight_probe(gpus: int) -> bool:
    """The compute probe of worker/preflight.py on each GPU, outside Ray: the product checked
    against its known answer, the time from CUDA events."""
    from ray_ormas import PreflightSettings
    from ray_ormas._internal.worker.preflight import compute_probe

    side = PreflightSettings().matmul_side(on_gpu=True)
    ok = True
    for index in range(gpus):
        try:
            seconds, flops = compute_probe(side, 5, torch.device(f"cuda:{index}"))
            said = f"cuda:{index} {side}x{side} matmul {seconds * 1000:.2f} ms, {flops / 1e12:.1f} TFLOP/s"
            problem = None
        except Exception as e:  # a wrong product is an ArithmeticError
            said, problem = "", f"{type(e).__name__}: {e}"
            ok = False
        print(f"{'FAIL' if problem else 'ok  '}  {'preflight':<12} {said} {problem or ''}", flush=True)
    return ok


def main() -> int:
    import argparse

    argparse.ArgumentParser(
        description="DDP + SyncBatchNorm + repair, FSDP2 bf16 and fp16 + GradScaler on every "
        "GPU of this machine (NCCL); exit 0 all passed, 1 a check failed, "
        "2 no CUDA device"
    ).parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU machine", file=sys.stderr)
        return 2
    import ray
    from ormas_monitor.record import verify_run

    gpus = torch.cuda.device_count()
    root = str(Path(__file__).resolve().parents[2])
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": root}})
    storage = tempfile.mkdtemp(prefix="ray-ormas-gpu-")
    print(f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, storage {storage}")
    if gpus == 1:
        print("note: one GPU, so SyncBatchNorm has no peer to synchronise with (world size 1)")

    def syncbn(result, events):
        out = result.return_value
        screens = result.ormas.fleet.preflight if result.ormas.fleet is not None else []
        if gpus > 1 and not all(r["device"].startswith("cuda") and not r["broken"] for s in screens for r in s["rows"]):
            return f"the pre-flight screen's rows: {screens}"
        if out["bn_types"] != ["SyncBatchNorm"]:
            return f"BatchNorm types {out['bn_types']}"
        if set(out["pairs"]) != {"conv1.0", "conv2.0", "conv3.0"}:
            return f"pairs {out['pairs']}"
        if not {e.get("layer") for e in events if e["event"] == "repair"} >= {"conv2.0", "conv3.0"}:
            return "the lesioned layers were not repaired"
        if len(set(result.ormas.digests()[-1])) != 1:
            return "replicas differ"
        return None if verify_run(result.ormas.record_dir).ok else "record does not verify"

    def fsdp(result, events):
        manifest = next(e for e in events if e["event"] == "manifest")
        if result.return_value["monitor_class"] != "ShardedGradientMonitor":
            return f"monitor class {result.return_value['monitor_class']}"
        if manifest["distributed"]["mode"] != "fsdp":
            return f"mode {manifest['distributed']['mode']}"
        return None if verify_run(result.ormas.record_dir).ok else "record does not verify"

    def amp(result, events):
        kinds = {e["event"] for e in events}
        if "skipped_step" not in kinds:
            return "no skipped_step recorded although the scale started at 2**40"
        if "alarm" in kinds or "nonfinite_gradient" in kinds:
            return "a scaler overflow was reported as an alarm"
        return None

    ok = [
        preflight_probe(gpus),
        run(
            "ddp-syncbn",
            ddp_syncbn_loop,
            storage,
            gpus,
            syncbn,
            repair=True,
            sync_batchnorm=True,
            check_every=10,
            train_loop_config={"steps": 200},
        ),
        run(
            "fsdp2-bf16",
            fsdp_bf16_loop,
            storage,
            gpus,
            fsdp,
            strategy="fsdp",
            check_every=5,
            train_loop_config={"steps": 40},
        ),
        run("amp-fp16", amp_loop, storage, gpus, amp, check_every=1, train_loop_config={"steps": 40}),
    ]
    ray.shutdown()
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
