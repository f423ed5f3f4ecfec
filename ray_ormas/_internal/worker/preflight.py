"""The pre-flight screen on every rank: the probes, then the head's verdict, before the first step.

worker/loop.py calls `screen` once per attempt, after the session opened and before the user's
loop. Every rank, in the same order:

1. the compute probe: a matmul of a matrix side sized to the device (`matmul_side`), timed
   `repeats` times (CUDA events on a GPU, the wall clock on CPU), the fastest counting (a
   moment descheduled on a busy node is noise; a slow node is slow every time, as timeit has
   it); its result is checked against
   a known answer: A = u v^T and B = w z^T of small integers make A @ B = (v . w) u z^T, exact
   in float32 (and in TF32), so a wrong product is a broken device, not rounding;
2. the link probe: two rounds of exchanges between pairs of ranks (ranks 0-1, 2-3, ..., then
   1-2, 3-4, ...), each after a barrier, over the training backend, `repeats` times a round; a
   rank's link time is its fastest, so a rank paired with a slow one is not blamed for it;
3. the collective probe: an all-reduce of `allreduce_mib` over the whole group, timed and
   checked (every rank adds rank + 1: the sum is known);
4. the user's probes, each a function returning named facts; one that raises is broken.

Then each rank hands its `ProbeResult` to the run ledger and waits for the verdict
(head/ledger.py `preflight`), which holds the order of the alarm's action when it has one: the
rank raises it here (`FleetReattemptError` for an evict, `FleetStopError` for a stop), before any
step. A probe that fails is recorded as broken and the screen goes on: the screen itself never
ends a fit unless its alarm's action says so. A collective that raises (a peer gone) leaves the
later collective probes out on that rank.

Hooks relied on: `torch.distributed` (the group Ray Train's `TorchConfig` set up: `barrier`,
`batch_isend_irecv`, `all_reduce`), `torch.cuda.Event`, `ray.get_runtime_context()`, and the
ledger's `preflight` call, awaited with a timeout through `ray.get`.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from typing import Any, Callable

import ray
import torch
import torch.distributed as dist

from ray_ormas._internal.common.fleet_policy import policy_name
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.preflight_settings import PreflightSettings
from ray_ormas._internal.fleet.preflight import ProbeResult
from ray_ormas._internal.worker.resume import order_error

logger = get_logger("ray_ormas.worker")
VERDICT_GRACE_S = 60.0  # beyond the screen's timeout_s: the head's own work on the verdict


def screen(ledger: Any, token: str, rank: int, world_size: int, settings: PreflightSettings, acts: bool) -> None:
    """Run the probes, send them to the ledger, and raise the order the verdict carries, if any.
    When an alarm can act (`acts`), the rank's worker actor goes with them, for an action on it
    (an evict's stacks, a kill); otherwise not: the head would not use it, and passing an actor
    handle delays the call by about 0.4 s on a 2-core machine (measured: the screen took 0.55 s
    with it, 0.15 s without)."""
    result = measure(rank, world_size, settings)
    handle = (ray.get_runtime_context().current_actor if acts else None, os.getpid())
    try:
        order = ray.get(
            ledger.preflight.remote(token, result, world_size, handle), timeout=settings.timeout_s + VERDICT_GRACE_S
        )
    except ray.exceptions.GetTimeoutError:
        logger.warning(
            "pre-flight: no verdict from the head within %g s; training goes on", settings.timeout_s + VERDICT_GRACE_S
        )
        return
    if order is not None:
        raise order_error(order)


def measure(rank: int, world_size: int, settings: PreflightSettings, device: torch.device | None = None) -> ProbeResult:
    """This rank's probe results (the collectives only when a process group is up)."""
    started = time.perf_counter()
    device = device or _device()
    broken: dict[str, str] = {}
    compute_s = flops = link_s = allreduce_s = bytes_per_s = None
    try:
        compute_s, flops = compute_probe(settings.matmul_side(device.type == "cuda"), settings.repeats, device)
    except Exception as e:
        broken["compute"] = _said(e)
    grouped = dist.is_available() and dist.is_initialized() and world_size > 1
    if grouped:
        size = max(int(settings.allreduce_mib * 2**20 / 4), 1)  # float32 elements
        comm_device = _comm_device(device)
        try:
            link_s = link_probe(rank, world_size, size, settings.repeats, comm_device)
            allreduce_s, bytes_per_s = allreduce_probe(rank, world_size, size, settings.repeats, comm_device)
        except Exception as e:  # a wrong sum, or a collective that failed: the rest would hang or fail too
            broken["collective"] = _said(e)
    facts: dict[str, Any] = {}
    for probe in settings.probes:
        name = policy_name(probe) or "probe"
        try:
            facts[name] = _facts_of(probe, settings.timeout_s)
        except Exception as e:
            broken[name] = _said(e)
    return ProbeResult(
        rank=rank,
        node=ray.util.get_node_ip_address(),
        node_id=ray.get_runtime_context().get_node_id(),
        device=str(device),
        compute_s=compute_s,
        flops=flops,
        link_s=link_s,
        allreduce_s=allreduce_s,
        bytes_per_s=bytes_per_s,
        facts=facts,
        broken=broken,
        seconds=round(time.perf_counter() - started, 4),
    )


def compute_probe(side: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """(the fastest of `repeats` side x side matmuls in seconds, its FLOP/s); raises when a
    product is wrong."""
    gen = torch.Generator().manual_seed(20261206)
    u, v, w, z = (torch.randint(1, 4, (side,), generator=gen, dtype=torch.float32) for _ in range(4))
    a, b = torch.outer(u, v).to(device), torch.outer(w, z).to(device)
    expected = (torch.dot(v, w) * torch.outer(u, z)).to(device)
    torch.matmul(a, b)  # warm-up: kernels chosen, memory allocated
    times = []
    for _ in range(repeats):
        product, seconds = _timed(lambda: torch.matmul(a, b), device)
        times.append(seconds)
        if not torch.equal(product, expected):
            wrong = int((product != expected).sum())
            raise ArithmeticError(f"the matmul's product is wrong in {wrong} of {side * side} entries")
    fastest = min(times)
    return fastest, 2 * side**3 / fastest if fastest > 0 else float("inf")


def link_probe(rank: int, world_size: int, size: int, repeats: int, device: torch.device) -> float | None:
    """The fastest of this rank's timed exchanges of `size` floats with its partners, `repeats`
    in each of two rounds (None: it had no partner in either round)."""
    send = torch.full((size,), float(rank), device=device)
    got = torch.empty(size, device=device)
    times = []
    for shift in (0, 1):
        partner = _partner(rank, world_size, shift)
        dist.barrier()
        if partner is None:
            continue
        _exchange(send[:1], got[:1], partner)  # the pair's connection, made outside the clock
        for _ in range(repeats):
            _, seconds = _timed(functools.partial(_exchange, send, got, partner), device)
            if got[0].item() != float(partner):
                raise ArithmeticError(f"the exchange with rank {partner} received {got[0].item()}, not {partner}")
            times.append(seconds)
    dist.barrier()
    return min(times) if times else None


def allreduce_probe(rank: int, world_size: int, size: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """(median seconds of an all-reduce of `size` floats, its bus bandwidth in bytes/s); raises
    when the sum is wrong."""
    expected = world_size * (world_size + 1) / 2
    times = []
    for _ in range(repeats):
        buffer = torch.full((size,), float(rank + 1), device=device)
        dist.barrier()
        _, seconds = _timed(functools.partial(dist.all_reduce, buffer), device)
        if buffer[0].item() != expected or buffer[-1].item() != expected:
            raise ArithmeticError(f"the all-reduce summed to {buffer[0].item()}, not {expected:g}")
        times.append(seconds)
    median = statistics.median(times)
    moved = 2 * (world_size - 1) / world_size * size * 4  # a ring all-reduce's bytes per rank
    return median, moved / median if median > 0 else float("inf")


def _partner(rank: int, world_size: int, shift: int) -> int | None:
    """This rank's partner in round `shift` (0: 0-1, 2-3, ...; 1: 1-2, 3-4, ..., and n-1 with 0
    when n is even), or None."""
    shifted = (rank - shift) % world_size
    other = shifted ^ 1
    if other >= world_size:
        return None
    partner = (other + shift) % world_size
    return partner if partner != rank else None


def _exchange(send: torch.Tensor, got: torch.Tensor, partner: int) -> None:
    ops = [dist.P2POp(dist.isend, send, partner), dist.P2POp(dist.irecv, got, partner)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """fn's value and its seconds, timed on the device (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        value = fn()
        end.record()
        end.synchronize()
        return value, start.elapsed_time(end) / 1000
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def _device() -> torch.device:
    """The device Ray Train gave this worker (its GPU, else the CPU)."""
    if torch.cuda.is_available():
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


def _comm_device(device: torch.device) -> torch.device:
    """Where the collectives' tensors live: the GPU under NCCL, the CPU under gloo."""
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def _facts_of(probe: Callable[[], Any], timeout_s: float) -> dict[str, Any]:
    """What `probe` returned, as named facts; raises what it raised, or TimeoutError past
    `timeout_s` (it runs on a thread of its own, left behind then: a probe cannot be cut)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["facts"] = probe()
        except BaseException as e:  # handed to the screen's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="ray-ormas-preflight-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"it did not return within the screen's timeout_s ({timeout_s:g} s)")
    if "error" in box:
        raise box["error"]
    facts = box.get("facts")
    if facts is None:
        return {}
    if not isinstance(facts, dict):
        raise TypeError(f"a pre-flight probe returns a dict of named facts, got {type(facts).__name__}")
    return {str(k): v if isinstance(v, (int, float, str, bool)) or v is None else repr(v) for k, v in facts.items()}


def _said(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]
