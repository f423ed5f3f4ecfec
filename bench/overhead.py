"""What the monitor costs on Ray: the same DDP loop under plain TorchTrainer and under RayOrmasTrainer.

    python bench/overhead.py [--models digits wide mlp] [--repeats 3] [--steps 400] [--workers 2]
                             [--check-every 50] [--with-report]

For each model (`digits`: the demo's CNN on 8x8 digits; `wide`: a larger synthetic CNN on 32x32
inputs; `mlp`: a fast MLP whose checks come every few tens of milliseconds, far more often than
Ray's 2 s report poll), runs plain `TorchTrainer`, `RayOrmasTrainer` watch-only and repair
(`--with-report`: also watch with a report at every check) `--repeats` times, interleaved, on one
local Ray cluster, and prints per configuration: the median step time (median over repeats of
each run's median; min-max of the run medians), the ratio to plain, the median time of sampled
(check) and unsampled steps, the cost of one check, the time from fit() to the first step and
its ratio to plain (`watch` tracks in MLflow, as by default; `watch-nomlflow` does not).
Step times are measured on rank 0 inside the loop (forward, backward, mon.step, optimizer step).

    python bench/overhead.py --paired [--models digits] [--repeats 5]

The paired measurement: in one run, two identical DDP replicas are stepped alternately, one with
the monitor and one without, so both share the same moment and contention; their ratio is the
monitor's own per-step cost without the run-to-run noise of a small shared machine.

    python bench/overhead.py --paired --attach explicit auto [--models digits mlp] [--repeats 4]

The same pairing with the monitored replica watched the zero-change way (docs/adoption.md): the
loop calls `ray.train.torch.prepare_model` and a loss module, builds no monitor, and ray-ormas's
optimizer step hook steps one; runs alternate between the two ways of attaching, in ABBA order.
There the monitor steps inside `optimizer.step()`: its time is the optimizer's own time to its
step pre-hook, less the plain replica's, and its checks come one loop step later.

    python bench/overhead.py --paired --fleet on acts [--models digits] [--repeats 4]

The same pairing with fleet health on, and with alarms that can act (`FleetSettings.actions`:
every alarm kind restarts, stops or diagnoses): runs alternate in ABBA order. Nothing fires in a
healthy run, so the difference is what acting costs while waiting: each rank reads the head's
answer to its previous check's facts at every check.

    python bench/overhead.py --in-process [--models mlp] [--repeats 3] [--steps 3000]

The same pairing with ormas-monitor's own `Monitor` in this process, without Ray or DDP: the
floor under what any integration of the monitor can cost per step on that model.

    python bench/overhead.py --scaling [--world-sizes 1 2 4 8] [--models digits wide mlp]

Per-check cost against world size (logical CPUs: 8 workers on a 2-core machine time-share, so
read the per-check cost, not the step time) and against model size: the paired measurement,
one run per point.

    python bench/overhead.py --fit-wall [--models mlp] [--steps 40] [--repeats 4] [--workers 2] [--without-screen]

What a short fit pays for the integration as a whole: the wall time of `fit()` itself, from the
call to its return, of the same short loop under plain `TorchTrainer` and under
`RayOrmasTrainer` (as by default: fleet health, the embedded MLflow store, the run page),
alternating in ABBA order on one cluster after one unmeasured plain fit; the ratio of the
medians, and where the difference goes: the start (from the call to the loop's first step) and
the end (from the loop's last step to the return). The first ray-ormas fit starts the job's
MLflow host (docs/mlflow.md), which the later ones share: it is in the medians, and is also
printed on its own, with the later fits' ratio. `--without-screen` adds a third arm, ray-ormas with
the pre-flight screen off (`FleetSettings(preflight=False)`), in the same rotation (ABC, CBA), so
the screen's share is told from the day's drift.

    python bench/overhead.py --device cuda --precision bf16 --workers 1

The same table on a GPU (NCCL, bf16 autocast), for a machine that has one.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

WARMUP = 20
MODELS = ("digits", "wide", "mlp")
CONFIGS = {
    "plain": None,
    "watch": {"repair": False},  # MLflow on (the default: the embedded store)
    "watch-nomlflow": {"repair": False, "mlflow": False},
    "repair": {"repair": True},
}
WITH_REPORT = {"watch+report": {"repair": False, "report_every": 1}}
NO_SCREEN = {"watch-noscreen": {"repair": False, "fleet": {"preflight": False}}}  # FleetSettings(**) in _trainer
FIT_WALL_CONFIGS = {"plain": "plain", "ray-ormas": "watch", "no screen": "watch-noscreen"}


def make_model(name: str) -> nn.Module:
    """`digits`: the demo's CNN (7 monitored layers, 26 k parameters); `wide`: 4 conv blocks up to
    256 channels (9 monitored layers, 0.4 M parameters) on 32x32 inputs; `mlp`: 3 linear layers (26 k)."""
    from ray_ormas.demo import DigitsCNN

    if name == "digits":
        return DigitsCNN()
    if name == "wide":

        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))

        return nn.Sequential(
            block(3, 32), block(32, 64), block(64, 128), block(128, 256), nn.Flatten(), nn.Linear(256 * 2 * 2, 10)
        )
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def make_data(name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    from ray_ormas.demo import load_digits

    if name == "wide":
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(512, 3, 32, 32, generator=g), torch.randint(0, 10, (512,), generator=g)
    else:
        x, y, _, _ = load_digits()
    return x.to(device), y.to(device)


def _autocast(config: dict[str, Any], device: torch.device) -> contextlib.AbstractContextManager:
    if config.get("precision") == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _setup(config: dict[str, Any]) -> tuple[torch.device, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    x, y = make_data(config["model"], device)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, len(x), (config["batch_size"],), generator=gen).to(device) for _ in range(64)]
    return device, x, y, batches


def bench_loop(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train.torch

    import ray_ormas

    device, x, y, batches = _setup(config)
    torch.manual_seed(0)
    monitored = config["mode"] != "plain"
    prepare = ray_ormas.prepare_model if monitored else ray.train.torch.prepare_model
    model = prepare(make_model(config["model"]))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = ray_ormas.monitor(model, opt) if monitored else None
    times, first = [], None
    for step in range(config["steps"]):
        idx = batches[step % len(batches)]
        t = time.perf_counter()
        with _autocast(config, device):
            loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if mon is not None:
            mon.step(loss)
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t)
        if first is None:
            first = time.time()
    return {"times": times, "first_step_at": first, "last_step_at": time.time()}


def paired_loop(config: dict[str, Any]) -> dict[str, Any]:
    """Two identical DDP replicas stepped alternately in one run: A with the monitor, B without.

    Both see the same process, the same moment and the same contention, so the ratio of their
    step times is the monitor's own cost without the run-to-run noise of a shared 2-core machine.
    """
    import ray_ormas

    device, x, y, batches = _setup(config)
    models, opts = [], []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(ray_ormas.prepare_model(make_model(config["model"])))
        opts.append(torch.optim.AdamW(models[-1].parameters(), lr=3e-3))
    mon = ray_ormas.monitor(models[0], opts[0])
    return alternate(config, device, x, y, batches, models, opts, mon)


class _StepHook:
    """Stands in for `mon` when ray-ormas's optimizer step hook steps the monitor (`--attach auto`),
    and times that hook. PyTorch runs an optimizer's own step pre-hooks after the global ones, so
    the time from right before `optimizer.step()` to its own pre-hook is the optimizer's wrapper
    plus ray-ormas's hook. The plain replica's optimizer, which ray-ormas ignores, gives the
    wrapper alone; the difference is the monitor's step."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self._called_at = [0.0] * len(optimizers)
        self._reached_after = [0.0] * len(optimizers)
        for k, optimizer in enumerate(optimizers):
            optimizer.register_step_pre_hook(functools.partial(self._reached, k))

    def step(self, loss: torch.Tensor) -> None:
        pass

    def before_optimizer_step(self, k: int) -> None:
        self._called_at[k] = time.perf_counter()

    def _reached(self, k: int, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._reached_after[k] = time.perf_counter() - self._called_at[k]

    def monitor_step_s(self) -> float:
        return self._reached_after[0] - self._reached_after[1]


def paired_auto_loop(config: dict[str, Any]) -> dict[str, Any]:
    """`paired_loop` written for TorchTrainer: no ray_ormas call, a loss module per replica. The
    plain replica's optimizer takes one (empty) step before any forward pass, so ray-ormas's hook
    meets it with no model and follows it never (it says so once); the monitored replica's
    optimizer meets its model at its first step."""
    import ray.train.torch

    device, x, y, batches = _setup(config)
    models, opts = [], []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(ray.train.torch.prepare_model(make_model(config["model"])))
        opts.append(torch.optim.AdamW(models[-1].parameters(), lr=3e-3))
    opts[1].step()  # no gradients yet: changes nothing, and leaves replica B unwatched
    criteria = [nn.CrossEntropyLoss(), nn.CrossEntropyLoss()]
    return alternate(config, device, x, y, batches, models, opts, _StepHook(opts), criteria)


def alternate(
    config: dict[str, Any],
    device: torch.device,
    x: torch.Tensor,
    y: torch.Tensor,
    batches: list[torch.Tensor],
    models: list[nn.Module],
    opts: list[torch.optim.Optimizer],
    mon: Any,
    criteria: list[Any] | None = None,
) -> dict[str, Any]:
    """The paired steps: replicas 0 (stepped with `mon`) and 1 (without), alternately."""
    criteria = criteria or [F.cross_entropy, F.cross_entropy]
    times: list[list[float]] = [[], []]
    in_step: list[float] = []  # time inside mon.step() alone
    for step in range(config["steps"]):
        idx = batches[step % len(batches)]
        for k in (0, 1) if step % 2 == 0 else (1, 0):  # alternate which goes first
            model, opt = models[k], opts[k]
            t = time.perf_counter()
            with _autocast(config, device):
                loss = criteria[k](model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            if k == 0:
                t_mon = time.perf_counter()
                mon.step(loss)
                _sync(device)
                in_step.append(time.perf_counter() - t_mon)
            if isinstance(mon, _StepHook):
                mon.before_optimizer_step(k)
            opt.step()
            _sync(device)
            del loss  # each replica frees its own autograd graph inside its own step time
            times[k].append(time.perf_counter() - t)
        if isinstance(mon, _StepHook):
            in_step[-1] = mon.monitor_step_s()  # the monitor stepped inside optimizer.step()
    return {
        "monitored": times[0],
        "plain": times[1],
        "in_step": in_step,
        "first_monitor_step": 1 if isinstance(mon, _StepHook) else 0,
    }


def run_in_process(args: argparse.Namespace) -> None:
    """The paired measurement with ormas-monitor's own `Monitor`, in this process, without Ray
    or DDP: the floor under what any integration of the monitor can cost on this model."""
    import tempfile

    from ormas_monitor import Monitor

    torch.set_num_threads(1)
    print(
        f"\nin process: ormas-monitor's own Monitor, no Ray, no DDP; paired replicas, check_every="
        f"{args.check_every}, {args.repeats} runs per model\n"
    )
    print(
        f"{'model':<7} {'run':<4} {'plain ms':>9} {'monitored ms':>13} {'median ratio':>12} "
        f"{'unsampled ratio':>15} {'Monitor.step off-check us':>25}"
    )
    device = torch.device("cpu")
    for model in args.models:
        x, y = make_data(model, device)
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, len(x), (args.batch_size,), generator=gen) for _ in range(64)]
        for rep in range(args.repeats):
            models, opts = [], []
            for _ in range(2):
                torch.manual_seed(0)
                models.append(make_model(model))
                opts.append(torch.optim.AdamW(models[-1].parameters(), lr=3e-3))
            with tempfile.TemporaryDirectory() as out:
                mon = Monitor(models[0], opts[0], out=out, check_every=args.check_every, verbose=False)
                r = paired_row(
                    alternate(_loop_config(args, model, "in-process"), device, x, y, batches, models, opts, mon),
                    args.check_every,
                )
                mon.close(report=False)
            print(
                f"{model:<7} {rep + 1:<4} {r['plain_ms']:>9.2f} {r['monitored_ms']:>13.2f} {r['ratio']:>12.3f} "
                f"{r['unsampled_ratio']:>15.3f} {r['off_check_us']:>25.1f}",
                flush=True,
            )


def paired_row(out: dict[str, Any], check_every: int) -> dict[str, float]:
    a, b = out["monitored"][WARMUP:], out["plain"][WARMUP:]
    start = WARMUP - out.get("first_monitor_step", 0)  # the automatic mode's monitor starts at loop step 1
    off = [i for i in range(len(a)) if (i + start) % check_every != 0]
    on = [i for i in range(len(a)) if (i + start) % check_every == 0]
    in_step = out["in_step"][WARMUP:]
    return {
        "plain_ms": 1e3 * statistics.median(b),
        "monitored_ms": 1e3 * statistics.median(a),
        "ratio": statistics.median(a) / statistics.median(b),
        "unsampled_ratio": statistics.median(a[i] for i in off) / statistics.median(b[i] for i in off),
        "mean_ratio": statistics.fmean(a) / statistics.fmean(b),
        "check_ms": 1e3 * statistics.median(in_step[i] for i in on) if on else float("nan"),
        "off_check_us": 1e6 * statistics.median(in_step[i] for i in off),
    }


ACTING = {"straggler": "reattempt", "divergence": "reattempt", "nonfinite": "stop", "hang": ["diagnose", "reattempt"]}


def fit_paired(
    args: argparse.Namespace, model: str, workers: int, attach: str = "explicit", fleet: str = "on"
) -> dict[str, Any]:
    from ray.train import FailureConfig, RunConfig

    from ray_ormas import FleetSettings, RayOrmasTrainer

    result = RayOrmasTrainer(
        paired_loop if attach == "explicit" else paired_auto_loop,
        train_loop_config=_loop_config(args, model, "paired"),
        check_every=args.check_every,
        verbose=False,
        fleet=FleetSettings(actions=ACTING) if fleet == "acts" else fleet == "on",
        scaling_config=_scaling(args, workers),
        run_config=RunConfig(
            name=f"bench-paired-{time.time_ns()}",
            storage_path=args.storage,
            failure_config=FailureConfig(max_failures=1 if fleet == "acts" else 0),
        ),
    ).fit()
    fleet = result.ormas.fleet
    return {**result.return_value, "head_ms": fleet.head_ms_per_check if fleet is not None else None}


def run_paired(args: argparse.Namespace) -> None:
    print(
        f"\npaired: one run, two replicas stepped alternately (A monitored, B plain), check_every="
        f"{args.check_every}, {args.workers} workers, fleet health {' / '.join(args.fleet)}, {args.repeats} runs "
        f"per model\n"
    )
    print(
        f"{'model':<7} {'attach':<8} {'fleet':<5} {'run':<4} {'plain ms':>9} {'monitored ms':>13} {'median ratio':>12} "
        f"{'unsampled ratio':>15} {'mean ratio':>10} {'check ms':>9} {'mon.step off-check us':>21} "
        f"{'head ms/check':>13}"
    )
    for model in args.models:
        for rep in range(args.repeats):
            ways = [(a, f) for a in args.attach for f in args.fleet]
            for attach, fleet in ways if rep % 2 == 0 else ways[::-1]:  # ABBA: no place favoured
                out = fit_paired(args, model, args.workers, attach, fleet)
                r = paired_row(out, args.check_every)
                head = "-" if out.get("head_ms") is None else f"{out['head_ms']:.3f}"
                print(
                    f"{model:<7} {attach:<8} {fleet:<5} {rep + 1:<4} {r['plain_ms']:>9.2f} {r['monitored_ms']:>13.2f} "
                    f"{r['ratio']:>12.3f} "
                    f"{r['unsampled_ratio']:>15.3f} {r['mean_ratio']:>10.3f} {r['check_ms']:>9.2f} "
                    f"{r['off_check_us']:>21.1f} {head:>13}",
                    flush=True,
                )


def fit_wall_once(args: argparse.Namespace, model: str, mode: str) -> dict[str, float]:
    """One whole fit of `bench_loop`: plain, ray-ormas (watch-only, everything else default) or
    ray-ormas without the pre-flight screen ("no screen")."""
    trainer = _trainer(args, model, FIT_WALL_CONFIGS[mode])
    started = time.time()
    out = trainer.fit().return_value  # rank 0's, as Ray Train returns it
    ended = time.time()
    return {"wall_s": ended - started, "start_s": out["first_step_at"] - started, "end_s": ended - out["last_step_at"]}


def run_fit_wall(args: argparse.Namespace) -> None:
    print(
        f"\nfit-wall: the whole fit() of a {args.steps}-step loop on {args.workers} workers, plain TorchTrainer "
        f"and RayOrmasTrainer (check_every={args.check_every}) alternating, {args.repeats} pairs per model\n"
    )
    print(f"{'model':<7} {'pair':<5} {'trainer':<10} {'fit s':>7} {'start s':>8} {'end s':>7}")
    for model in args.models:
        fit_wall_once(args, model, "plain")  # the cluster's first fit pays for what later ones reuse
        modes = ["plain", "ray-ormas", *(["no screen"] if args.without_screen else [])]
        walls: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for rep in range(args.repeats):
            for mode in modes if rep % 2 == 0 else modes[::-1]:  # ABBA (ABC CBA): no place favoured
                row = fit_wall_once(args, model, mode)
                walls[mode].append(row)
                print(
                    f"{model:<7} {rep + 1:<5} {mode:<10} {row['wall_s']:>7.2f} {row['start_s']:>8.2f} "
                    f"{row['end_s']:>7.2f}",
                    flush=True,
                )
        plain = statistics.median(r["wall_s"] for r in walls["plain"])
        ormas = statistics.median(r["wall_s"] for r in walls["ray-ormas"])
        phases = {
            mode: (statistics.median(r["start_s"] for r in rows), statistics.median(r["end_s"] for r in rows))
            for mode, rows in walls.items()
        }
        if args.without_screen:
            unscreened = statistics.median(r["wall_s"] for r in walls["no screen"])
            print(
                f"{model:<7} without the pre-flight screen: {unscreened:.2f} s (start "
                f"{statistics.median(r['start_s'] for r in walls['no screen']):.2f}), ratio {unscreened / plain:.3f}; "
                f"the screen's share: {ormas / unscreened:.3f}",
                flush=True,
            )
        first, later = walls["ray-ormas"][0], walls["ray-ormas"][1:]
        print(
            f"{model:<7} medians: plain {plain:.2f} s (start {phases['plain'][0]:.2f}, end {phases['plain'][1]:.2f}), "
            f"ray-ormas {ormas:.2f} s (start {phases['ray-ormas'][0]:.2f}, end {phases['ray-ormas'][1]:.2f}); "
            f"ratio {ormas / plain:.3f}",
            flush=True,
        )
        print(
            f"{model:<7} the first ray-ormas fit (it starts the job's MLflow host): {first['wall_s']:.2f} s, "
            f"start {first['start_s']:.2f} s"
            + (
                f"; the later ones' median {statistics.median(r['wall_s'] for r in later):.2f} s, ratio "
                f"{statistics.median(r['wall_s'] for r in later) / plain:.3f}"
                if later
                else ""
            )
            + "\n",
            flush=True,
        )


def run_scaling(args: argparse.Namespace) -> None:
    print(
        f"\nscaling: the paired measurement, one run per point, check_every={args.check_every}; "
        f"{os.cpu_count()} CPUs (more workers than CPUs time-share: read the check cost)\n"
    )
    print(
        f"{'model':<7} {'params':>8} {'workers':>7} {'plain ms':>9} {'check ms':>9} {'off-check us':>12} "
        f"{'median ratio':>12} {'head ms/check':>13}"
    )
    for model in args.models:
        params = sum(p.numel() for p in make_model(model).parameters())
        for workers in args.world_sizes:
            out = fit_paired(args, model, workers, fleet=args.fleet[0])
            r = paired_row(out, args.check_every)
            head = "-" if out.get("head_ms") is None else f"{out['head_ms']:.3f}"
            print(
                f"{model:<7} {params:>8,} {workers:>7} {r['plain_ms']:>9.2f} {r['check_ms']:>9.2f} "
                f"{r['off_check_us']:>12.1f} {r['ratio']:>12.3f} {head:>13}",
                flush=True,
            )


def _loop_config(args: argparse.Namespace, model: str, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "model": model,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "precision": args.precision,
    }


def _scaling(args: argparse.Namespace, workers: int) -> Any:
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=workers, use_gpu=args.device == "cuda")


def _trainer(args: argparse.Namespace, model: str, config: str) -> Any:
    """`bench_loop` under plain `TorchTrainer` (`config` "plain") or under `RayOrmasTrainer` with
    one of `CONFIGS` / `WITH_REPORT`."""
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from ray_ormas import FleetSettings, RayOrmasTrainer

    common: dict[str, Any] = {
        "train_loop_config": _loop_config(args, model, config),
        "scaling_config": _scaling(args, args.workers),
        "run_config": RunConfig(name=f"bench-{model}-{config}-{time.time_ns()}", storage_path=args.storage),
    }
    if config == "plain":
        return TorchTrainer(bench_loop, **common)
    options = dict({**CONFIGS, **WITH_REPORT, **NO_SCREEN}[config] or {})
    if "fleet" in options:
        options["fleet"] = FleetSettings(**options["fleet"])
    return RayOrmasTrainer(bench_loop, check_every=args.check_every, verbose=False, **common, **options)


def run_once(name: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    start = time.time()
    out = _trainer(args, model, name).fit().return_value
    out["startup"] = out["first_step_at"] - start
    out["fit_s"] = time.time() - start
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], check_every: int) -> list[dict[str, Any]]:
    rows = []
    for name, rs in runs.items():
        medians, means, sampled, unsampled = [], [], [], []
        for r in rs:
            ts = r["times"][WARMUP:]
            medians.append(statistics.median(ts))
            means.append(statistics.fmean(ts))
            sampled += [t for i, t in enumerate(r["times"]) if i >= WARMUP and i % check_every == 0]
            unsampled += [t for i, t in enumerate(r["times"]) if i >= WARMUP and i % check_every != 0]
        rows.append(
            {
                "config": name,
                "median_ms": 1e3 * statistics.median(medians),
                "min_ms": 1e3 * min(medians),
                "max_ms": 1e3 * max(medians),
                "mean_ms": 1e3 * statistics.median(means),
                "sampled_ms": 1e3 * statistics.median(sampled) if sampled else float("nan"),
                "unsampled_ms": 1e3 * statistics.median(unsampled),
                "startup_s": statistics.median(r["startup"] for r in rs),
                "fit_s": statistics.median(r["fit_s"] for r in rs),
            }
        )
    plain = rows[0]
    for row in rows:
        row["ratio"] = row["median_ms"] / plain["median_ms"]
        row["mean_ratio"] = row["mean_ms"] / plain["mean_ms"]
        row["unsampled_ratio"] = row["unsampled_ms"] / plain["unsampled_ms"]
        row["check_cost_ms"] = row["sampled_ms"] - plain["sampled_ms"]
        row["startup_ratio"] = row["startup_s"] / plain["startup_s"]
    return rows


def run_table(args: argparse.Namespace) -> None:
    configs = [*CONFIGS, *(WITH_REPORT if args.with_report else {})]
    for model in args.models:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        for rep in range(args.repeats):
            for name in configs:
                runs[name].append(run_once(name, model, args))
                print(
                    f"{model} repeat {rep + 1}/{args.repeats} {name}: median "
                    f"{1e3 * statistics.median(runs[name][-1]['times'][WARMUP:]):.2f} ms/step",
                    flush=True,
                )
        rows = summarize(runs, args.check_every)
        print(
            f"\n{model}: {args.workers} workers ({args.device}, {args.precision}), batch {args.batch_size}/rank, "
            f"{args.steps} steps, check_every={args.check_every}, {args.repeats} repeats interleaved; "
            f"torch {torch.__version__}, {os.cpu_count()} CPUs"
        )
        print(
            f"{'config':<15} {'median ms':>9} {'min-max':>13} {'ratio':>6} {'mean ratio':>10} "
            f"{'unsampled':>9} {'unsamp.ratio':>12} {'sampled':>8} {'check cost':>10} {'startup s':>9} "
            f"{'start ratio':>11} "
            f"{'fit s':>6}"
        )
        for r in rows:
            print(
                f"{r['config']:<15} {r['median_ms']:>9.2f} {r['min_ms']:>6.2f}-{r['max_ms']:<6.2f} "
                f"{r['ratio']:>6.3f} {r['mean_ratio']:>10.3f} {r['unsampled_ms']:>9.2f} "
                f"{r['unsampled_ratio']:>12.3f} {r['sampled_ms']:>8.2f} {r['check_cost_ms']:>10.2f} "
                f"{r['startup_s']:>9.2f} {r['startup_ratio']:>11.3f} {r['fit_s']:>6.1f}",
                flush=True,
            )
        print()


def parser() -> argparse.ArgumentParser:
    """The command line's options (tests/test_doc_commands.py reads what a documented command sets)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--check-every", type=int, default=50)
    p.add_argument("--with-report", action="store_true", help="also watch with a ray.train.report at every check")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--storage", default="/tmp/ray_ormas_bench")
    p.add_argument("--paired", action="store_true", help="only the paired measurement (monitored vs plain replica)")
    p.add_argument(
        "--attach",
        nargs="+",
        choices=("explicit", "auto"),
        default=["explicit"],
        help="paired runs: the monitored replica watched by ray_ormas.monitor (explicit) or by the "
        "optimizer step hook (auto, an unchanged Ray Train loop); several alternate",
    )
    p.add_argument("--scaling", action="store_true", help="per-check cost against world size and model size")
    p.add_argument(
        "--fit-wall",
        action="store_true",
        help="the whole fit() of a short loop, plain TorchTrainer against RayOrmasTrainer, alternating",
    )
    p.add_argument(
        "--without-screen",
        action="store_true",
        help="fit-wall: also RayOrmasTrainer with the pre-flight screen off (FleetSettings(preflight=False))",
    )
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument(
        "--in-process",
        action="store_true",
        help="the paired measurement with ormas-monitor's own Monitor in this process, without Ray",
    )
    p.add_argument(
        "--fleet",
        nargs="+",
        choices=("on", "off", "acts"),
        default=["on"],
        help="fleet health in the paired and scaling runs (on: the default with more than one worker; acts: "
        "with alarms that can act); several alternate in the paired runs",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if args.in_process:
        run_in_process(args)
        return

    import ray

    cpus = max(args.workers, *args.world_sizes, 2) if args.scaling else max(args.workers, 2)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        if args.scaling:
            run_scaling(args)
        elif args.fit_wall:
            run_fit_wall(args)
        elif args.paired:
            run_paired(args)
        else:
            run_table(args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
