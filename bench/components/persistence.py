"""What persisting the record costs: record size per 1000 steps, the time of one upload, and
the bytes sent per checkpoint over a long run on an S3 API.

    python bench/components/persistence.py [--steps 1000] [--check-every 50 10] [--uploads 20]
    python bench/components/persistence.py --long 100000 [--checkpoint-every 2000]

A real ormas-monitor `Monitor` watches the digits CNN (one process, no Ray) for `--steps`
optimizer steps in a segment claimed from a non-local `RecordStore`; then the whole segment is
copied `--uploads` times, as rank 0 does when the segment closes, to a `SubTreeFileSystem` and to an
fsspec-backed filesystem, both over the local disk (no network on the test machine, so this is
the cost on our side: listing, opening, copying; S3 adds its own latency per file). Prints the
record's size and the median and max upload time.

`--long STEPS` simulates a run of STEPS optimizer steps at check_every=10 on the S3 API server
the tests use (moto on 127.0.0.1, tests/s3_server.py): the record grows with lines copied from a
real 1000-step record, and at every `--checkpoint-every` steps storage is brought up to date both
ways, the old (copy the whole segment, `pyarrow.fs.copy_files`) and the new (send what is new,
`IncrementalUpload.push`, uploads.py). Prints the bytes each sends per checkpoint as the record
grows, and the totals.

What either writes goes into one temporary folder, removed when it ends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import pyarrow.fs as pafs
import torch
import torch.nn.functional as F
from ormas_monitor import Monitor
from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem, SubTreeFileSystem

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ray_ormas._internal.record.store import RecordStore  # noqa: E402
from ray_ormas._internal.seams.ormas import flush_metrics  # noqa: E402
from ray_ormas.demo import DigitsCNN, load_digits  # noqa: E402


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
        loss = F.cross_entropy(net(x[i : i + 32]), y[i : i + 32])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    flush_metrics(mon)  # mid-run, as at a checkpoint: no run_end, no reports yet
    return path, local


def long_run(steps: int, checkpoint_every: int) -> None:
    import os

    from ray_ormas._internal.record.uploads import IncrementalUpload
    from tests.s3_server import S3Server, free_port, s3_environment

    every = 10
    template_root = Path(tempfile.mkdtemp(prefix="ray-ormas-bench-"))
    _, template = record(RecordStore(SubTreeFileSystem(str(template_root), LocalFileSystem()), "t/ormas"), 1000, every)
    lines = {
        name: (template / name).read_bytes().splitlines(keepends=True) for name in ("diary.jsonl", "metrics.jsonl")
    }
    server = S3Server(free_port())
    os.environ.update(s3_environment(server.port))
    server.start()
    try:
        old = RecordStore.at(f"{server.bucket('old')}/runs/bench/ormas")
        new = RecordStore.at(f"{server.bucket('new')}/runs/bench/ormas")
        local = Path(tempfile.mkdtemp(prefix="ray-ormas-bench-"))
        (local / "segment.json").write_text('{"segment": 0}\n')
        incremental = IncrementalUpload(new, local, f"{new.root}/model/segment-000")
        print(
            f"a {steps}-step run at check_every={every}, a checkpoint every {checkpoint_every} steps, "
            f"on moto's S3 API ({server.endpoint})"
        )
        print(
            f"{'checkpoint':>10} {'step':>7} {'record KiB':>10} {'whole copy KiB':>14} {'new lines KiB':>13} "
            f"{'whole ms':>8} {'new ms':>7}"
        )
        totals = [0, 0, 0.0, 0.0]
        checkpoints = steps // checkpoint_every
        per_checkpoint = {name: len(ls) * checkpoint_every // 1000 for name, ls in lines.items()}
        for k in range(1, checkpoints + 1):
            for name, template_lines in lines.items():
                with open(local / name, "ab") as f:
                    for i in range(per_checkpoint[name]):
                        f.write(template_lines[(k * per_checkpoint[name] + i) % len(template_lines)])
            size = sum(f.stat().st_size for f in local.iterdir())
            t = time.perf_counter()
            pafs.copy_files(
                str(local),
                f"{old.root}/model/segment-000",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=old.filesystem,
            )
            whole_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            sent = incremental.push()
            new_ms = (time.perf_counter() - t) * 1000
            totals = [totals[0] + size, totals[1] + sent, totals[2] + whole_ms, totals[3] + new_ms]
            if k in (1, 2) or k % max(1, checkpoints // 10) == 0:
                print(
                    f"{k:>10} {k * checkpoint_every:>7} {size / 1024:>10.1f} {size / 1024:>14.1f} "
                    f"{sent / 1024:>13.1f} {whole_ms:>8.1f} {new_ms:>7.1f}"
                )
        print(
            f"{'total':>10} {'':>7} {'':>10} {totals[0] / 1024:>14.1f} {totals[1] / 1024:>13.1f} "
            f"{totals[2]:>8.0f} {totals[3]:>7.0f}"
        )
        assert new.read_bytes(f"{new.root}/model/segment-000/metrics.jsonl") == (local / "metrics.jsonl").read_bytes()
    finally:
        server.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--check-every", type=int, nargs="+", default=[50, 10])
    p.add_argument("--uploads", type=int, default=20)
    p.add_argument("--long", type=int, metavar="STEPS", help="simulate a run this long on the S3 API server")
    p.add_argument("--checkpoint-every", type=int, default=2000, help="with --long (default: %(default)s)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ray-ormas-bench-") as scratch:
        tempfile.tempdir = scratch  # every folder made here, the store's staging too, goes with it
        try:
            if a.long:
                long_run(a.long, a.checkpoint_every)
            else:
                compare(a.steps, a.check_every, a.uploads)
        finally:
            tempfile.tempdir = None


def compare(steps: int, check_everies: list[int], uploads: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="ray-ormas-bench-"))
    filesystems = {
        "SubTreeFileSystem": lambda d: SubTreeFileSystem(str(d), LocalFileSystem()),
        "fsspec (file)": lambda d: SubTreeFileSystem(str(d), PyFileSystem(FSSpecHandler(fsspec.filesystem("file")))),
    }
    print(f"{steps} steps of the digits CNN; {uploads} uploads each; {torch.__version__}")
    print(
        f"{'check_every':>11} {'diary KiB':>9} {'metrics KiB':>11} {'KiB/1000 steps':>14}  "
        f"{'filesystem':<18} {'median ms':>9} {'max ms':>7}"
    )
    for every in check_everies:
        for fs_name, make in filesystems.items():
            bucket = root / f"{every}-{len(fs_name)}"
            bucket.mkdir()
            store = RecordStore(make(bucket), "runs/bench/ormas")
            path, local = record(store, steps, every)
            times = []
            for _ in range(uploads):
                t = time.perf_counter()
                pafs.copy_files(
                    str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=store.filesystem
                )
                times.append((time.perf_counter() - t) * 1000)
            diary_kib = (local / "diary.jsonl").stat().st_size / 1024
            metrics_kib = (local / "metrics.jsonl").stat().st_size / 1024
            per_1000 = (diary_kib + metrics_kib) * 1000 / steps
            print(
                f"{every:>11} {diary_kib:>9.1f} {metrics_kib:>11.1f} {per_1000:>14.1f}  {fs_name:<18} "
                f"{statistics.median(times):>9.2f} {max(times):>7.2f}"
            )


if __name__ == "__main__":
    main()
