"""What the monitor costs on Ray: the same DDP loop under plain TorchTrainer and under RayOrmasTrainer.

    python bench/overhead.py [--repeats 3] [--steps 400] [--workers 2] [--check-every 50]

Runs every configuration `--repeats` times, interleaved (plain, watch, watch+report every check,
repair, plain, ...), on one local Ray cluster, and prints per configuration: the median step time
(median over repeats of each run's median; min-max of the run medians), the ratio to plain, the
median time of sampled (check) and unsampled steps, and the time from fit() to the first step.
Step times are measured on rank 0 inside the loop (forward, backward, mon.step, optimizer step).

    python bench/overhead.py --paired [--repeats 5]

The paired measurement: in one run, two identical DDP replicas are stepped alternately, one with
the monitor and one without, so both share the same moment and contention; their ratio is the
monitor's own per-step cost without the run-to-run noise of a small shared machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

WARMUP = 20


def bench_loop(config: dict[str, Any]) -> dict[str, Any]:
    import ray.train
    import ray.train.torch

    import ray_ormas
    from ray_ormas.demo import DigitsCNN, load_digits

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    x, y, _, _ = load_digits()
    monitored = config["mode"] != "plain"
    prepare = ray_ormas.prepare_model if monitored else ray.train.torch.prepare_model
    model = prepare(DigitsCNN())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = ray_ormas.monitor(model, opt) if monitored else None
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, len(x), (config["batch_size"],), generator=gen) for _ in range(64)]
    times, first = [], None
    for step in range(config["steps"]):
        idx = batches[step % len(batches)]
        t = time.perf_counter()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if mon is not None:
            mon.step(loss)
        opt.step()
        times.append(time.perf_counter() - t)
        if first is None:
            first = time.time()
    return {"times": times, "first_step_at": first}


def paired_loop(config: dict[str, Any]) -> dict[str, Any]:
    """Two identical DDP replicas stepped alternately in one run: A with the monitor, B without.

    Both see the same process, the same moment and the same contention, so the ratio of their
    step times is the monitor's own cost without the run-to-run noise of a shared 2-core machine.
    """
    import ray.train

    import ray_ormas
    from ray_ormas.demo import DigitsCNN, load_digits

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    x, y, _, _ = load_digits()
    models, opts = [], []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(ray_ormas.prepare_model(DigitsCNN()))
        opts.append(torch.optim.AdamW(models[-1].parameters(), lr=3e-3))
    mon = ray_ormas.monitor(models[0], opts[0])
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, len(x), (config["batch_size"],), generator=gen) for _ in range(64)]
    times: list[list[float]] = [[], []]
    in_step: list[float] = []                                   # time inside mon.step() alone
    for step in range(config["steps"]):
        idx = batches[step % len(batches)]
        for k in ((0, 1) if step % 2 == 0 else (1, 0)):        # alternate which goes first
            model, opt = models[k], opts[k]
            t = time.perf_counter()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            if k == 0:
                t_mon = time.perf_counter()
                mon.step(loss)
                in_step.append(time.perf_counter() - t_mon)
            opt.step()
            times[k].append(time.perf_counter() - t)
    return {"monitored": times[0], "plain": times[1], "in_step": in_step}


def run_paired(args: argparse.Namespace) -> None:
    from ray.train import RunConfig, ScalingConfig

    from ray_ormas import RayOrmasTrainer
    print(f"\npaired: one run, two replicas stepped alternately (A monitored, B plain), "
          f"check_every={args.check_every}, {args.repeats} runs\n")
    print(f"{'run':<4} {'plain ms':>9} {'monitored ms':>13} {'median ratio':>12} {'unsampled ratio':>15} "
          f"{'mean ratio':>10} {'check cost ms':>13} {'mon.step off-check us':>21}")
    for rep in range(args.repeats):
        out = RayOrmasTrainer(paired_loop, train_loop_config={"steps": args.steps, "batch_size": args.batch_size},
                              check_every=args.check_every, verbose=False,
                              scaling_config=ScalingConfig(num_workers=args.workers),
                              run_config=RunConfig(name=f"bench-paired-{time.time_ns()}", storage_path=args.storage)
                              ).fit().return_value
        a, b = out["monitored"][WARMUP:], out["plain"][WARMUP:]
        off = [i for i in range(len(a)) if (i + WARMUP) % args.check_every != 0]
        on = [i for i in range(len(a)) if (i + WARMUP) % args.check_every == 0]
        check_cost = statistics.median(a[i] - b[i] for i in on) if on else float("nan")
        in_step = out["in_step"][WARMUP:]
        step_off = statistics.median(in_step[i] for i in off)
        print(f"{rep + 1:<4} {1e3 * statistics.median(b):>9.2f} {1e3 * statistics.median(a):>13.2f} "
              f"{statistics.median(a) / statistics.median(b):>12.3f} "
              f"{statistics.median(a[i] for i in off) / statistics.median(b[i] for i in off):>15.3f} "
              f"{statistics.fmean(a) / statistics.fmean(b):>10.3f} {1e3 * check_cost:>13.2f} "
              f"{1e6 * step_off:>21.1f}", flush=True)


CONFIGS = {
    "plain": {},
    "watch": {"repair": False},
    "watch+report": {"repair": False, "report_every": 1},
    "repair": {"repair": True},
}


def run_once(name: str, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_ormas import RayOrmasTrainer
    loop_config = {"mode": name, "steps": args.steps, "batch_size": args.batch_size}
    scaling = ScalingConfig(num_workers=args.workers)
    run_config = RunConfig(name=f"bench-{name}-{time.time_ns()}", storage_path=storage)
    start = time.time()
    if name == "plain":
        result = TorchTrainer(bench_loop, train_loop_config=loop_config, scaling_config=scaling,
                              run_config=run_config).fit()
    else:
        result = RayOrmasTrainer(bench_loop, train_loop_config=loop_config, check_every=args.check_every,
                                 verbose=False, scaling_config=scaling, run_config=run_config,
                                 **CONFIGS[name]).fit()
    out = result.return_value
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
        rows.append({"config": name, "median_ms": 1e3 * statistics.median(medians),
                     "min_ms": 1e3 * min(medians), "max_ms": 1e3 * max(medians),
                     "mean_ms": 1e3 * statistics.median(means),
                     "sampled_ms": 1e3 * statistics.median(sampled) if sampled else float("nan"),
                     "unsampled_ms": 1e3 * statistics.median(unsampled),
                     "startup_s": statistics.median(r["startup"] for r in rs),
                     "fit_s": statistics.median(r["fit_s"] for r in rs)})
    plain = rows[0]
    for row in rows:
        row["ratio"] = row["median_ms"] / plain["median_ms"]
        row["mean_ratio"] = row["mean_ms"] / plain["mean_ms"]
        row["unsampled_ratio"] = row["unsampled_ms"] / plain["unsampled_ms"]
        row["check_cost_ms"] = row["sampled_ms"] - plain["sampled_ms"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--check-every", type=int, default=50)
    p.add_argument("--storage", default="/tmp/ray_ormas_bench")
    p.add_argument("--paired", action="store_true", help="only the paired measurement (monitored vs plain replica)")
    args = p.parse_args()

    import ray
    ray.init(num_cpus=max(args.workers, 2), include_dashboard=False, log_to_driver=False)
    if args.paired:
        run_paired(args)
        ray.shutdown()
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    for rep in range(args.repeats):
        for name in CONFIGS:
            runs[name].append(run_once(name, args, args.storage))
            print(f"repeat {rep + 1}/{args.repeats} {name}: median "
                  f"{1e3 * statistics.median(runs[name][-1]['times'][WARMUP:]):.2f} ms/step", flush=True)
    ray.shutdown()
    rows = summarize(runs, args.check_every)
    print(f"\n{args.workers} workers, digits CNN, batch {args.batch_size}/rank, {args.steps} steps, "
          f"check_every={args.check_every}, {args.repeats} repeats interleaved; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs\n")
    print("median: median over repeats of each run's median step; min-max: of those run medians; mean: the same "
          "with each run's mean step (sampled steps and reports included); unsampled / sampled: median step off / "
          "on a check; check cost: sampled minus plain's sampled; startup: fit() to first step; fit: whole fit()\n")
    print(f"{'config':<13} {'median ms':>9} {'min-max':>13} {'ratio':>6} {'mean ms':>8} {'mean ratio':>10} "
          f"{'unsampled':>9} {'unsamp.ratio':>12} {'sampled':>8} {'check cost':>10} {'startup s':>9} {'fit s':>6}")
    for r in rows:
        print(f"{r['config']:<13} {r['median_ms']:>9.2f} {r['min_ms']:>6.2f}-{r['max_ms']:<6.2f} {r['ratio']:>6.3f} "
              f"{r['mean_ms']:>8.2f} {r['mean_ratio']:>10.3f} {r['unsampled_ms']:>9.2f} {r['unsampled_ratio']:>12.3f} "
              f"{r['sampled_ms']:>8.2f} {r['check_cost_ms']:>10.2f} {r['startup_s']:>9.1f} {r['fit_s']:>6.1f}")


if __name__ == "__main__":
    main()
