"""Training loops the integration tests run on real Ray workers, steered by their config dict.

Each loop uses the public worker API exactly as a user would: `ray_ormas.prepare_model`,
`ray_ormas.monitor`, `mon.step(loss)` between backward and the optimizer step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.nn.functional as F

import ray_ormas
from examples.transformer import TinyTransformer
from ray_ormas.demo import DigitsCNN, lesion, load_digits


def digits_loop(config: dict[str, Any]) -> dict[str, Any]:
    """DDP training of the digits CNN for `steps` optimizer steps (per rank: `steps_by_rank`).

    Options: lesion (zero conv2, conv3), report_at (steps after which to call ray_ormas.report),
    checkpoint (those reports carry a checkpoint), raise_at (step at which rank `raise_rank`
    raises ValueError), fail_once_marker (rank 0 raises at step 5 unless this file exists, and
    creates it: a failure in the first attempt only), kill_server_at / server_pgid (rank 0 kills
    that process group at that step), sleep_per_step, no_optimizer (monitor without the optimizer),
    close_in_loop (close the monitor inside the loop and check what close() returns on each rank),
    explode_at (from that step on the loss is multiplied by 10^4: exploding-gradient alarms),
    unreachable_port (every rank refuses connections to 127.0.0.1 at that port, e.g. the tracking
    server's, and checks that it cannot reach it).

    Fleet health: tiny (a 16-channel CNN whose forward takes about a millisecond, instead of the
    digits CNN), spinners (rank 0 starts that many processes that spin on a CPU until the loop
    ends, at most 5 minutes), slow_rank / slow_from / slow_s (that rank sleeps in its data loading from that
    step on), nudge_rank / nudge_at (that rank changes conv2's weights, the tiny CNN's first conv's, outside
    DDP after that step's update), nan_rank / nan_at (that rank's loss is NaN at that step), hang_rank / hang_at (that
    rank raises Ray's NCCLHangError, as the hang detector would end the group), stall_rank / stall_at /
    stall_s (that rank sleeps between that step's backward and its monitor step: the others pass
    that check and wait for it in the next all-reduce), block_rank / block_at (that rank blocks
    forever before that step's backward, in `block_forever_before_backward`), scrape_to /
    scrape_until (while the loop runs, rank 0 reads the head node's Prometheus endpoint every 2 s,
    as Prometheus would, into that file, until every one of those strings is in it).

    Fleet actions: slow_node (the rank on that node, a hex node id, is the slow_rank: a slow
    node rather than a slow rank), hold_at / hold_until / hold_timeout_s (every rank waits at
    that step until that file exists, at most that long: a scenario changes the cluster
    meanwhile), node_log (each rank writes its node's id to a file named after the time it
    started, in that folder), resume (start from `ray_ormas.load_checkpoint`,
    at its step), ormas_checkpoint (the reports of report_at carry `ray_ormas.save_checkpoint`),
    once_dir (each of the faults nudge, hang, block and nan fires once per fit, whatever attempt
    reaches its step first: a marker file in that folder says it fired), step_log (rank 0's own
    clock of each step: `log_step`).
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if config.get("unreachable_port"):
        _refuse_port(config["unreachable_port"])
    x, y, _, _ = load_digits(0)
    x, y = x[rank::world], y[rank::world]
    net = tiny_cnn() if config.get("tiny") else DigitsCNN()
    if config.get("lesion"):
        lesion(net)
    model = ray_ormas.prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, None if config.get("no_optimizer") else opt)
    steps = config.get("steps_by_rank", {}).get(str(rank), config.get("steps", 20))
    gen = torch.Generator().manual_seed(100 + rank)
    spinners = _spinners(config.get("spinners", 0) if rank == 0 else 0)
    scrape = config.get("scrape_to") if rank == 0 else None
    scraping = _scrape_while_training(scrape, config["scrape_until"]) if scrape else None
    state = ray_ormas.load_checkpoint(model, opt) if config.get("resume") else None
    once = _Once(config.get("once_dir"))
    node = ray.get_runtime_context().get_node_id()
    if config.get("node_log"):  # where this rank of this attempt runs: one file per worker start
        started = f"{time.time():.6f}-rank{rank}"
        Path(config["node_log"], started).write_text(node)
    if node == config.get("slow_node"):
        config = {**config, "slow_rank": rank}
    for step in range(state.step if state is not None else 0, steps):
        top = time.time()
        if step == config.get("raise_at") and rank in config.get("raise_ranks", [rank]):
            raise ValueError(f"boom at step {step} on rank {rank}")
        if rank == 0 and step == config.get("kill_server_at"):
            import signal  # the test's MLflow server dies mid-training

            os.killpg(config["server_pgid"], signal.SIGKILL)
        if config.get("sleep_per_step"):
            time.sleep(config["sleep_per_step"])
        marker = config.get("fail_once_marker")
        if marker and step == 5 and rank == 0 and not os.path.exists(marker):
            open(marker, "w").close()  # only the first attempt fails
            raise RuntimeError("injected failure")
        if rank == config.get("hang_rank") and step == config.get("hang_at") and once("hang"):
            from ray.train import NCCLHangError

            raise NCCLHangError(f"rank {rank} stuck in all_reduce (injected)", {})
        if rank == config.get("slow_rank") and step >= config.get("slow_from", 0):
            time.sleep(config["slow_s"])  # a slow data loader on this rank only
        if step == config.get("hold_at") and config.get("hold_until"):
            hold_until(config["hold_until"], config.get("hold_timeout_s", 120.0))
        idx = torch.randint(0, len(x), (32,), generator=gen)
        forward = time.time()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if step >= config.get("explode_at", 1 << 30):
            loss = loss * 1e4  # gradients 10^4 x their baseline: alarms
        if rank == config.get("nan_rank") and step == config.get("nan_at") and once("nan"):
            loss = loss * float("nan")
        opt.zero_grad()
        if rank == config.get("block_rank") and step == config.get("block_at") and once("block"):
            block_forever_before_backward()
        loss.backward()
        if rank == config.get("stall_rank") and step == config.get("stall_at"):
            stall_between_backward_and_check(config["stall_s"])
        called = time.time()
        mon.step(loss)
        returned = time.time()
        opt.step()
        log_step(config, rank, step=step, top=top, forward=forward, called=called, returned=returned, end=time.time())
        if rank == config.get("nudge_rank") and step == config.get("nudge_at") and once("nudge"):
            with torch.no_grad():  # outside DDP: the replicas now differ
                (net.conv2[0] if isinstance(net, DigitsCNN) else net[0]).weight.add_(1e-3)
        if step + 1 in config.get("report_at", []):
            if config.get("ormas_checkpoint"):
                checkpoint = ray_ormas.save_checkpoint(model, opt, step=step + 1)
                ray_ormas.report({"user_step": step + 1}, checkpoint=checkpoint)
            elif config.get("checkpoint"):
                import tempfile

                with tempfile.TemporaryDirectory() as d:  # the report (synchronous) copies it to storage
                    if rank == 0:
                        torch.save(model.state_dict(), f"{d}/model.pt")
                    checkpoint = ray.train.Checkpoint.from_directory(d) if rank == 0 else None
                    ray_ormas.report({"user_step": step + 1}, checkpoint=checkpoint)
            else:
                ray_ormas.report({"user_step": step + 1})
    for p in spinners:
        p.kill()
        p.wait()
    if scraping is not None:
        scraping()
    out: dict[str, Any] = {"model_type": type(model).__name__, "fleet_probe": mon._runtime._probe is not None}
    if isinstance(net, DigitsCNN):
        out["conv2_abs"] = float(net.conv2[0].weight.detach().abs().sum())
        out["conv3_abs"] = float(net.conv3[0].weight.detach().abs().sum())
    if config.get("close_in_loop"):
        closed = mon.close()
        if rank != 0 and closed is not None:
            raise AssertionError(f"close() returned {closed!r} on rank {rank}; expected None")
        out["closed"] = str(closed)
    return out


def log_step(config: dict[str, Any], rank: int, **fields: Any) -> None:
    """With `step_log` (a file): rank 0 appends one JSON line (a step's start and end, or the
    moment it killed itself), the loop's own clock for the goodput tests."""
    if rank == 0 and config.get("step_log"):
        with open(config["step_log"], "a") as f:
            f.write(json.dumps(fields) + "\n")


def read_step_log(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


class _Once:
    """`once(name)`: True the first time in the fit (across attempts) that a fault fires, when
    the loop has a `once_dir`; always True without one."""

    def __init__(self, folder: str | None) -> None:
        self._folder = folder

    def __call__(self, name: str) -> bool:
        if self._folder is None:
            return True
        marker = os.path.join(self._folder, name)
        try:
            with open(marker, "x"):
                return True
        except FileExistsError:
            return False


def stall_between_backward_and_check(seconds: float) -> None:
    """A rank stuck in Python for a while (the name its stack shows)."""
    import time

    time.sleep(seconds)


def diagnose_rank_1_at_check_3(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A fleet policy of the tests' own: counts the checks it was shown (in its memory) and, at
    the first attempt's check 3, asks for rank 1's stacks."""
    view.memory["seen"] = view.memory.get("seen", 0) + 1
    if view.attempt == 0 and view.check == 3:
        return ray_ormas.FleetAction("diagnose", ranks=[1], reason=f"shown {view.memory['seen']} checks")
    return None


class FailOnNode:
    """A pre-flight probe of the tests' own (`PreflightSettings(probes=[FailOnNode(node_id)])`): a
    read of the run's storage that fails on one node, as an unmounted volume would."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def __call__(self) -> dict[str, Any]:
        import ray

        if ray.get_runtime_context().get_node_id() == self.node_id:
            raise OSError("the run's storage is not mounted on this node (a fault the test made)")
        return {"storage": "readable"}


def evict_rank_1_after_the_first_attempt(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A fleet policy of the tests' own, a fault that comes back after every restart: from the
    second attempt on, at each attempt's check 3, it asks to evict rank 1's node."""
    if view.attempt >= 1 and view.check == 3:
        return ray_ormas.FleetAction("evict", ranks=[1], reason=f"attempt {view.attempt} reached check 3")
    return None


def evict_rank_1_then_reattempt_the_grown_attempt(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A fleet policy of the tests' own for an elastic fit (tests/scenarios/elastic.py): once, at
    the first attempt's first check from run step 24 on (three epochs of `elastic_loop` at 2
    ranks, so a checkpoint is registered), it asks for rank 1's stacks and then to evict its node;
    at the third attempt's (the group grown back) check 3, it asks to restart the group (whose
    screen then stops the fit: the scenario's `StorageLostOnRank`)."""
    if view.attempt == 0 and view.run_step >= 24 and not view.memory.get("evicted"):
        view.memory["evicted"] = True
        return ray_ormas.FleetAction(["diagnose", "evict"], ranks=[1], reason=f"run step {view.run_step}")
    if view.attempt == 2 and view.check == 3:
        return ray_ormas.FleetAction("reattempt", ranks=[0], reason="the grown attempt reached check 3")
    return None


def reattempt_the_grown_attempt_once(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A fleet policy of the tests' own for an elastic fit (tests/scenarios/elastic.py): at the
    third attempt's (the group grown back) check 2, it asks to restart the group."""
    if view.attempt == 2 and view.check == 2:
        return ray_ormas.FleetAction("reattempt", ranks=[0], reason="the grown attempt reached check 2")
    return None


def reattempt_at_the_fifth_attempts_nan(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None:
    """A fleet policy of the tests' own for tests/scenarios/acts.py: in the fifth attempt, at the
    first check where a rank's loss is NaN, it asks once to restart the group, at the same check
    as the `nonfinite` alarm (whose action is `stop`: the most severe is carried out)."""
    nan = [row.rank for row in view.ranks if row.loss is not None and row.loss != row.loss]  # NaN's ranks
    if view.attempt == 4 and nan and not view.memory.get("asked"):
        view.memory["asked"] = True  # once
        return ray_ormas.FleetAction("reattempt", ranks=nan, reason="a loss that is not finite: start again")
    return None


class StorageLostOnRank:
    """A pre-flight probe of the tests' own for tests/scenarios/acts.py and elastic.py: a read of the run's
    storage, which fails on `rank` at its `call`-th screen (its attempt's, counted in `count_dir`:
    one screen per attempt), as a volume that came unmounted on that rank's node would."""

    def __init__(self, rank: int, call: int, count_dir: str) -> None:
        self.rank, self.call, self.count_dir = rank, call, count_dir

    def __call__(self) -> dict[str, Any]:
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        counted = Path(self.count_dir) / f"preflight-rank{rank}"
        with counted.open("a") as f:
            f.write("screened\n")
        if rank == self.rank and len(counted.read_text().splitlines()) == self.call:
            raise OSError("the run's storage is not mounted on this node (a fault the test made)")
        return {"storage": "readable"}


def block_forever_before_backward() -> None:
    """A rank stuck in Python (the name its stack shows)."""
    import threading

    threading.Event().wait()


def tiny_cnn() -> torch.nn.Module:
    """One 16-channel Conv -> BatchNorm -> ReLU block and a linear head: about 1 ms forward."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 10)
    )


def nan_on_rank(rank: int, model_class: str, at_forward: int) -> None:
    """From inside a worker: on world rank `rank`, the `at_forward`-th training forward (from 0)
    of the modules of class `model_class` gives a NaN loss: an output with a `loss` gets that loss
    times NaN, a tensor output is multiplied by NaN. The loop itself is unchanged; a global forward
    hook does it, for the rest of the process."""
    if ray.train.get_context().get_world_rank() != rank:
        return
    seen = [0]

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if type(module).__name__ != model_class or not module.training or not torch.is_grad_enabled():
            return None
        seen[0] += 1
        if seen[0] - 1 != at_forward:
            return None
        if isinstance(output, torch.Tensor):
            return output * float("nan")
        output["loss"] = output["loss"] * float("nan")
        return output

    torch.nn.modules.module.register_module_forward_hook(hook)


def _scrape_while_training(path: str, until: list[str]) -> Any:
    """A thread that reads the head node's metrics endpoint every 2 s into `path` until every
    string in `until` is there; returns what ends it (waiting up to 25 s for those strings)."""
    import urllib.request

    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])  # one node: the head
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(2.0):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            except OSError:
                continue
            Path(path + ".part").write_text(text)
            os.replace(path + ".part", path)
            if all(x in text for x in until):
                return

    thread = threading.Thread(target=scrape, name="test-metrics-scrape", daemon=True)
    thread.start()

    def finish() -> None:  # the run's last alarms reach Ray's export within its 10 s interval
        thread.join(timeout=25)
        stop.set()
        thread.join(timeout=15)

    return finish


def _spinners(n: int) -> list[subprocess.Popen]:
    """n processes that keep a CPU busy until killed, or for 5 minutes (so none outlives a test)."""
    spin = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(n)]


def _wait_until_answers(url: str, timeout_s: float) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s") from None
            time.sleep(0.5)


def _refuse_port(port: int) -> None:
    """This worker process can no longer open a connection to 127.0.0.1:`port` (Python sockets:
    what MLflow's client and urllib use); checked before training."""
    import socket
    import urllib.request

    connect = socket.socket.connect

    def refusing(sock: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[1] == port:
            raise ConnectionRefusedError(f"this worker may not reach port {port}")
        connect(sock, address)

    socket.socket.connect = refusing
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    except OSError:
        return
    raise AssertionError(f"the worker still reaches 127.0.0.1:{port}")


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
    restored too. Options: epochs, lesion (zero conv2 and conv3 first), kill_rank / kill_at (that
    rank SIGKILLs itself before global step `kill_at`, once: `kill_marker` is created first),
    sleep_per_step, kill_server_at + server_pgid (rank 0 SIGKILLs that process group before that
    global step), extra_metrics (reports also carry the loss, a string and a NaN), storage_root +
    storage_check (rank 0 reads the persisted diary through that SubTreeFileSystem root after
    each checkpoint report and returns the line counts it saw), upload_mode (Ray's
    CheckpointUploadMode by name, e.g. "ASYNC"; a list: one per epoch, in turn), done_marker +
    sleep_after (rank 0 creates that file after its last report and sleeps that long before
    returning), slow_rank + slow_s (that rank sleeps that long before every step), wait_for_url +
    wait_at (rank 0 waits before that global step until the URL answers, at most 5 minutes: a
    tracker outage the test started ends inside the fit however slow the machine is at bringing
    the server back), nudge_rank / nudge_at / once_dir (that rank changes conv2's weights outside
    DDP after that global step's update, once per fit: the replicas diverge, as in `digits_loop`).
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
    net = DigitsCNN()
    if config.get("lesion"):
        lesion(net)  # a checkpoint, when there is one, brings the weights it saved
    model = ray_ormas.prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, opt)
    state = ray_ormas.load_checkpoint(model, opt, sampler=sampler)
    step = state.step if state else 0
    once = _Once(config.get("once_dir"))
    persisted = []
    for epoch in range(state.epoch + 1 if state else 0, config.get("epochs", 4)):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            top = time.time()
            marker = config.get("kill_marker")
            if rank == config.get("kill_rank") and step == config.get("kill_at") and not os.path.exists(marker):
                open(marker, "w").close()
                log_step(config, rank, killed=step, at=time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            if config.get("sleep_per_step"):
                time.sleep(config["sleep_per_step"])
            if rank == config.get("slow_rank"):
                time.sleep(config["slow_s"])  # a slow data loader on this rank only (fleet health)
            if rank == 0 and step == config.get("kill_server_at"):
                os.killpg(config["server_pgid"], signal.SIGKILL)
            if rank == 0 and step == config.get("wait_at"):
                _wait_until_answers(config["wait_for_url"], timeout_s=300)
            loss = F.cross_entropy(model(xb + 0.05 * torch.randn_like(xb)), yb)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)
            opt.step()
            log_step(config, rank, step=step, top=top, end=time.time())
            if rank == config.get("nudge_rank") and step == config.get("nudge_at") and once("nudge"):
                with torch.no_grad():  # outside DDP: the replicas now differ
                    net.conv2[0].weight.add_(1e-3)
            step += 1
        saving = time.time()
        checkpoint = ray_ormas.save_checkpoint(model, opt, epoch=epoch, step=step, sampler=sampler)
        metrics: dict[str, Any] = {"epoch": epoch, "step": step}
        if config.get("extra_metrics"):
            metrics.update(loss=float(loss), note=f"epoch {epoch}", ratio=float("nan"))
        modes = config.get("upload_mode") or []
        modes = [modes] if isinstance(modes, str) else modes
        upload = {"checkpoint_upload_mode": ray.train.CheckpointUploadMode[modes[epoch % len(modes)]]} if modes else {}
        ray_ormas.report(metrics, checkpoint=checkpoint, **upload)
        log_step(config, rank, saved=time.time() - saving)
        if rank == 0 and config.get("storage_check"):
            from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

            store = ray_ormas.RecordStore(SubTreeFileSystem(config["storage_root"], LocalFileSystem()), "")
            persisted.append((store.read_bytes(config["storage_check"]) or b"").count(b"\n"))
    if rank == 0 and config.get("done_marker"):
        open(config["done_marker"], "w").close()
        time.sleep(config.get("sleep_after", 0))
    return {"step": step, "resumed_from_epoch": state.epoch if state else None, "persisted_lines": persisted}


def elastic_loop(config: dict[str, Any]) -> dict[str, Any]:
    """A resumable DDP loop for elastic fits: the trainer's global batch (`ray_ormas.batch_size()`
    per rank) over a DistributedSampler of 512 digits, so every epoch is 8 optimizer steps at any
    world size; a checkpoint every epoch. It stops `epochs_after_growth` epochs into an attempt
    that resumed at `grown_size` ranks (the same decision on every rank: it depends only on the
    checkpoint and the world size), else after `epochs`. Options: sleep_per_step."""
    import time

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y, _, _ = load_digits(0)
    data = TensorDataset(x[:512], y[:512])
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=ray_ormas.batch_size(), sampler=sampler, drop_last=True)
    model = ray_ormas.prepare_model(DigitsCNN())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = ray_ormas.monitor(model, opt)
    state = ray_ormas.load_checkpoint(model, opt, sampler=sampler)
    step = state.step if state else 0
    first = state.epoch + 1 if state else 0
    last = config.get("epochs", 40)
    if state is not None and world == config.get("grown_size"):
        last = min(last, first + config.get("epochs_after_growth", 2))
    for epoch in range(first, last):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            time.sleep(config.get("sleep_per_step", 0))
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)
            opt.step()
            step += 1
        checkpoint = ray_ormas.save_checkpoint(model, opt, epoch=epoch, step=step, sampler=sampler)
        ray_ormas.report({"epoch": epoch, "step": step, "world": world}, checkpoint=checkpoint)
    return {"step": step, "world": world, "per_rank_batch": ray_ormas.batch_size()}


def fsdp_transformer_loop(config: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 training of one TinyTransformer per way of sharding (`shardings`: a monitor name ->
    `parallel_strategy_kwargs`, None for FSDP2's default of one unit per child module), each with
    its optimizer and its monitor, on the same synthetic sequence batches. At step `probe_step`
    every rank gathers each model's full gradients (a collective) so rank 0 can return the true
    global norm of each layer, to compare with what its monitor recorded. From `explode_at` on,
    the losses are multiplied by 10^4, so the gradient alarms must fire. Then each trained model's
    checkpoint round (`fsdp_checkpoint_round`). Returns, per monitor name, what it saw."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    trained = {}
    for name, kwargs in config["shardings"].items():
        model = ray_ormas.prepare_model(TinyTransformer(), parallel_strategy_kwargs=kwargs)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        trained[name] = (model, opt, ray_ormas.monitor(model, opt, name=name), kwargs)
    gen = torch.Generator().manual_seed(rank)
    reference: dict[str, dict[str, float]] = {name: {} for name in trained}
    steps = config.get("steps", 12)
    for step in range(steps):
        start = torch.randint(0, 32, (16, 1), generator=gen)
        seq = (start + torch.arange(9)) % 32  # learnable: each token is the previous + 1
        for name, (model, opt, mon, _) in trained.items():
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 32), seq[:, 1:].reshape(-1))
            if step >= config.get("explode_at", 1 << 30):
                loss = loss * 1e4  # gradients 10^4 x their baseline: alarms
            opt.zero_grad()
            loss.backward()
            if step == config.get("probe_step"):
                for layer, module in model.named_modules():
                    grads = [p.grad.full_tensor() for p in module.parameters(recurse=False) if p.grad is not None]
                    if grads:
                        reference[name][layer] = float(torch.sqrt(sum(g.float().norm() ** 2 for g in grads)))
            mon.step(loss)
            opt.step()
    return {
        name: {
            "reference": reference[name],
            "dtensor_params": all(hasattr(p, "placements") for p in model.parameters()),
            "monitor_class": type(mon.monitor).__name__,
            "checkpoint": fsdp_checkpoint_round(model, opt, steps, kwargs),
        }
        for name, (model, opt, mon, kwargs) in trained.items()
    }


def hold_until(path: str, timeout_s: float) -> tuple[float, bool]:
    """Wait until the file `path` exists, at most `timeout_s`: the seconds waited, and whether it
    came (a scenario's marker: the loop trains on once something else has happened)."""
    held = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - held < timeout_s:
        time.sleep(0.2)
    return time.monotonic() - held, os.path.exists(path)


def accumulation_loop(config: dict[str, Any]) -> None:
    """DDP with gradient accumulation: `accumulation` micro-batches per optimizer step, the
    all-reduce skipped on all but the last (ray_ormas.no_sync), losses given with micro_step.
    Every rank writes what it saw to `out_dir/rank<r>.json`, and a file per start of its loop
    (`out_dir/start-rank<r>-<ns>`, with its node's id). With `hold_until` (a path), every rank
    waits after optimizer step `hold_after` until that file exists (at most `hold_timeout_s`):
    the fit trains on while something else happens on its nodes (tests/scenarios/bystander.py)."""
    import json

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    node = ray.get_runtime_context().get_node_id()
    Path(config["out_dir"], f"start-rank{rank}-{time.time_ns()}").write_text(node)
    k = config["accumulation"]
    x, y, _, _ = load_digits(0)
    x, y = x[rank::world], y[rank::world]
    model = ray_ormas.prepare_model(DigitsCNN())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = ray_ormas.monitor(model, opt)
    per_rank = ray_ormas.batch_size()
    seen: dict[str, Any] = {
        "per_rank_batch": per_rank,
        "optimizer_steps": 0,
        "window_means": [],
        "grad_after_micro": None,
        "grad_after_sync": None,
    }
    losses = []
    for i in range(config["micro_batches"]):
        last = (i + 1) % k == 0
        xb, yb = x[i * per_rank : (i + 1) * per_rank], y[i * per_rank : (i + 1) * per_rank]
        with ray_ormas.no_sync(model, active=not last):
            loss = F.cross_entropy(model(xb), yb)
            (loss / k).backward()
        mon.micro_step(loss)
        losses.append(float(loss))
        if i == 0:
            seen["grad_after_micro"] = float(model.module.head.weight.grad.sum())
        if last:
            if seen["grad_after_sync"] is None:
                seen["grad_after_sync"] = float(model.module.head.weight.grad.sum())
            seen["window_means"].append(sum(losses[-k:]) / k)
            mon.step()
            opt.step()
            opt.zero_grad()
            seen["optimizer_steps"] += 1
            if config.get("hold_until") and seen["optimizer_steps"] == config.get("hold_after", 3):
                held_s, released = hold_until(config["hold_until"], config["hold_timeout_s"])
                seen.update(held_s=held_s, released=released)
    seen["monitor_steps"] = mon.steps
    seen["node"] = node
    with open(os.path.join(config["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


def amp_loop(config: dict[str, Any]) -> dict[str, Any]:
    """bf16 autocast on CPU with a GradScaler given to the monitor. At `overflow_at` every rank
    makes one gradient infinite after backward: the scaler skips that step, and the monitor must
    record it as a skipped step, not as an alarm."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    x, y, _, _ = load_digits(0)
    model = ray_ormas.prepare_model(DigitsCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    mon = ray_ormas.monitor(model, opt, scaler=scaler)
    dtypes = set()
    scales = []
    for step in range(config.get("steps", 12)):
        idx = slice((step * 32 + rank * 16) % 1400, (step * 32 + rank * 16) % 1400 + 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x[idx])
            dtypes.add(str(out.dtype))
            loss = F.cross_entropy(out.float(), y[idx])
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step == config.get("overflow_at"):
            with torch.no_grad():  # DDP's module, or the model itself in local mode
                getattr(model, "module", model).head.weight.grad[0, 0] = float("inf")
        mon.step(loss)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return {"dtypes": sorted(dtypes), "scales": scales}


def gan_loop(config: dict[str, Any]) -> dict[str, Any]:
    """A small GAN on 8x8 digits: generator and discriminator wrapped on their own (two DDP
    models), each with its own optimizer and its own monitor ("generator", "discriminator")."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    x, _, _, _ = load_digits(0)
    real_all = x.reshape(len(x), -1) * 2 - 1
    gen = ray_ormas.prepare_model(
        torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Tanh()
        )
    )
    disc = ray_ormas.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LeakyReLU(0.2), torch.nn.Linear(64, 1))
    )
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    mon_g = ray_ormas.monitor(gen, opt_g, name="generator")
    mon_d = ray_ormas.monitor(disc, opt_d, name="discriminator")
    bce = torch.nn.BCEWithLogitsLoss()
    noise = torch.Generator().manual_seed(rank)
    for step in range(config.get("steps", 12)):
        real = real_all[(step * 32 + rank * 16) % 1400 :][:32]
        fake = gen(torch.randn(32, 16, generator=noise))
        # discriminator: one forward over real and fake together, then its own step
        logits = disc(torch.cat([real, fake.detach()]))
        d_loss = bce(logits, torch.cat([torch.ones(32, 1), torch.zeros(32, 1)]))
        opt_d.zero_grad()
        d_loss.backward()
        mon_d.step(d_loss)
        opt_d.step()
        # generator: through the discriminator, which is not stepped here
        g_loss = bce(disc(fake), torch.ones(32, 1))
        opt_g.zero_grad()
        g_loss.backward()
        mon_g.step(g_loss)
        opt_g.step()
    return {"generator_steps": mon_g.steps, "discriminator_steps": mon_d.steps}


def fsdp_checkpoint_round(
    model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, fsdp_kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    """FSDP2, on a sharded model trained for `step` steps: save_checkpoint (a gather on every
    rank), load it into a freshly initialised model sharded alike on every rank, then step both
    identically (outside the monitor): they must stay bit-identical."""
    from ray.train.collective import broadcast_from_rank_zero
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    rank = ray.train.get_context().get_world_rank()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, 32, (16, 1), generator=torch.Generator().manual_seed(1000 * step + rank))
        seq = (start + torch.arange(9)) % 32
        return seq[:, :-1], seq[:, 1:]

    def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
        for step in steps:
            x, y = batch(step)
            loss = F.cross_entropy(model(x).reshape(-1, 32), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()

    def full(model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.full_tensor() for p in model.parameters()]

    ckpt = ray_ormas.save_checkpoint(model, opt, epoch=0, step=step)
    path = broadcast_from_rank_zero(ckpt.path if ckpt is not None else None)
    torch.manual_seed(123)  # a different initialisation
    fresh = ray_ormas.prepare_model(TinyTransformer(), parallel_strategy_kwargs=fsdp_kwargs)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    state = ray_ormas.load_checkpoint(fresh, fresh_opt, checkpoint=ray.train.Checkpoint(path))
    same_params = all(torch.equal(a, b) for a, b in zip(full(model), full(fresh)))
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    a, b = (
        get_optimizer_state_dict(model, opt, options=options),
        get_optimizer_state_dict(fresh, fresh_opt, options=options),
    )
    same_optimizer = rank != 0 or all(
        torch.equal(torch.as_tensor(a["state"][k][s]), torch.as_tensor(b["state"][k][s]))
        for k in a["state"]
        for s in a["state"][k]
    )
    train(model, opt, range(step, step + 4))
    train(fresh, fresh_opt, range(step, step + 4))
    same_after = all(torch.equal(x, y) for x, y in zip(full(model), full(fresh)))
    saved_keys = sorted(torch.load(f"{path}/state.pt", weights_only=True)["model"]) if rank == 0 else []
    if rank == 0:  # never reported, so nothing else removes it
        shutil.rmtree(path)
    return {
        "step": state.step,
        "same_params": same_params,
        "same_optimizer": same_optimizer,
        "same_after_training": same_after,
        "saved_keys": saved_keys[:3],
    }


def failing_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss for `ray-ormas train` that fails: the CLI must exit 1 with the error."""
    raise RuntimeError("loss function failed on purpose")


def worker_view_loop(config: dict[str, Any]) -> dict[str, Any]:
    """What the trainer's arguments look like from a worker: the rows of the `train` dataset
    (unsplit, by the dataset config); ray_ormas.epochs over a loader from
    ray.train.torch.prepare_data_loader (a DistributedSampler with shuffle) at this rank's share
    of the global batch, giving the first batch's samples of each epoch; then a monitored step
    and a checkpoint reported for validation."""
    import tempfile

    from torch.utils.data import DataLoader, TensorDataset

    ctx = ray.train.get_context()
    rows = sum(len(batch["x"]) for batch in ray.train.get_dataset_shard("train").iter_batches(batch_size=4))
    torch.manual_seed(0)
    _, y, _, _ = load_digits(0)
    data = TensorDataset(torch.arange(len(y)), y)
    loader = ray.train.torch.prepare_data_loader(DataLoader(data, batch_size=ray_ormas.batch_size(), shuffle=True))
    model = ray_ormas.prepare_model(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = ray_ormas.monitor(model, opt)
    firsts = []
    for _ in ray_ormas.epochs(loader, 3):
        firsts.append(next(iter(loader))[0].tolist())
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    mon.step(loss)
    opt.step()
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if ctx.get_world_rank() == 0:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(d)
        ray_ormas.report({"loss": float(loss.detach())}, checkpoint=checkpoint, validation=checkpoint is not None)
    return {"rows": rows, "first_batches": firsts, "batch_size": ray_ormas.batch_size()}


def validate_checkpoint(checkpoint: ray.train.Checkpoint) -> dict[str, float]:
    """A validation function for `ValidationConfig`: the checkpoint holds the model."""
    with checkpoint.as_directory() as d:
        return {"validated_params": float(sum(t.numel() for t in torch.load(os.path.join(d, "model.pt")).values()))}


def local_mode_loop(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train's local mode: this runs in the driver's process. Digits CNN, a report, and a
    raise at `raise_at` (the loop's own error) if given."""
    x, y, _, _ = load_digits(0)
    torch.manual_seed(0)
    net = DigitsCNN()
    lesion(net)
    model = ray_ormas.prepare_model(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = ray_ormas.monitor(model, opt)
    for step in range(config["steps"]):
        if step == config.get("raise_at"):
            raise ValueError(f"the loop failed on purpose at step {step}")
        loss = F.cross_entropy(model(x[step * 16 : (step + 1) * 16]), y[step * 16 : (step + 1) * 16])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    ray_ormas.report({"last_loss": float(loss.detach())})
    return {"pid": os.getpid(), "world_size": ray.train.get_context().get_world_size()}
