"""What persisting the record costs: record size per 1000 steps, and the time of one upload.

    python bench/persistence.py [--steps 1000] [--check-every 50 10] [--uploads 20]

A real ormas-monitor `Monitor` watches the digits CNN (one process, no Ray) for `--steps`
optimizer steps in a segment claimed from a non-local `RecordStore`; then the segment is
uploaded `--uploads` times, as rank 0 does at each checkpoint, to a `SubTreeFileSystem` and to an
fsspec-backed filesystem, both over the local disk (no network on the test machine, so this is
the cost on our side: listing, opening, copying; S3 adds its own latency per file). Prints the
record's size and the median and max upload time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import torch
import torch.nn.functional as F
from ormas_monitor import Monitor
from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem, SubTreeFileSystem

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ray_ormas.compat import flush_metrics  # noqa: E402
from ray_ormas.demo import DigitsCNN, load_digits  # noqa: E402
from ray_ormas.storage import RecordStore  # noqa: E402


def record(store: RecordStore, steps: int, check_every: int) -> tuple[str, Path]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y, _, _ = load_digits(0)
    net = DigitsCNN()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    path, local = store.claim_segment("model", {})
    mon = Monitor(net, opt, out=local, check_every=check_every, verbose=False)
    for step in range(steps):
        i = (step * 32) % (len(x) - 32)
        loss = F.cross_entropy(net(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    flush_metrics(mon)      # mid-run, as at a checkpoint: no run_end, no reports yet
    return path, local


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--check-every", type=int, nargs="+", default=[50, 10])
    p.add_argument("--uploads", type=int, default=20)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ray-ormas-bench-"))
    filesystems = {"SubTreeFileSystem": lambda d: SubTreeFileSystem(str(d), LocalFileSystem()),
                   "fsspec (file)": lambda d: SubTreeFileSystem(str(d), PyFileSystem(FSSpecHandler(fsspec.filesystem("file"))))}
    print(f"{a.steps} steps of the digits CNN; {a.uploads} uploads each; {torch.__version__}")
    print(f"{'check_every':>11} {'diary KiB':>9} {'metrics KiB':>11} {'KiB/1000 steps':>14}  "
          f"{'filesystem':<18} {'median ms':>9} {'max ms':>7}")
    for every in a.check_every:
        for fs_name, make in filesystems.items():
            bucket = root / f"{every}-{len(fs_name)}"
            bucket.mkdir()
            store = RecordStore(make(bucket), "runs/bench/ormas")
            path, local = record(store, a.steps, every)
            times = []
            for _ in range(a.uploads):
                t = time.perf_counter()
                store.upload(local, path)
                times.append((time.perf_counter() - t) * 1000)
            diary_kib = (local / "diary.jsonl").stat().st_size / 1024
            metrics_kib = (local / "metrics.jsonl").stat().st_size / 1024
            per_1000 = (diary_kib + metrics_kib) * 1000 / a.steps
            print(f"{every:>11} {diary_kib:>9.1f} {metrics_kib:>11.1f} {per_1000:>14.1f}  {fs_name:<18} "
                  f"{statistics.median(times):>9.2f} {max(times):>7.2f}")


if __name__ == "__main__":
    main()
