"""The workers' side of the run ledger's meetings: every rank arrives before each ray-ormas report.

`ray.train.report` is a barrier: ranks that call it different numbers of times hang. `meet`
turns that into an error naming the ranks (`RankMismatchError`, `RankSyncTimeoutError`).

Hooks relied on: the run ledger's actor calls `arrive` and `arrived` (head/ledger.py), awaited
with a timeout through `ray.get`.
"""

from __future__ import annotations

from typing import Any

import ray

from ray_ormas._internal.common.meetings import Arrival
from ray_ormas.errors import RankMismatchError, RankSyncTimeoutError


def meet(
    ledger: Any,
    token: str,
    seq: int,
    rank: int,
    world_size: int,
    kind: str,
    step: int,
    timeout_s: float,
    checkpoint: bool = False,
) -> dict[int, Arrival]:
    """Meet every other rank at the ledger before report number `seq`; raise instead of hanging.

    Returns {rank: Arrival}. Raises RankMismatchError if ranks are at different kinds of
    report, RankSyncTimeoutError if some rank has not arrived after `timeout_s`.
    """
    ref = ledger.arrive.remote(token, seq, rank, kind, step, checkpoint, world_size)
    try:
        seen = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        seen = ray.get(ledger.arrived.remote(token, seq), timeout=30)
        missing = sorted(set(range(world_size)) - set(seen))
        raise RankSyncTimeoutError(
            f"rank {rank} waited {timeout_s:g} s at ray-ormas report #{seq} ({kind}, after {step} monitor steps) "
            f"for rank(s) {missing}, which never arrived. They are still training, stuck, or waiting in a "
            f"collective (a DDP all-reduce) for a rank that already finished its loop: "
            f"{_describe(seen)}. Give every rank the same number of batches (ray.train.torch."
            f"prepare_data_loader or a DistributedSampler with drop_last), or raise sync_timeout_s if a rank "
            f"is legitimately slower"
        ) from None
    kinds = {a.kind for a in seen.values()}
    if len(kinds) > 1:
        raise RankMismatchError(
            f"ranks reached different ray-ormas reports at report #{seq}: {_describe(seen)}. Every rank "
            f"must run the same number of optimizer steps and call ray_ormas.report the same number of "
            f"times (ray.train.report is a barrier); give every rank the same number of batches "
            f"(ray.train.torch.prepare_data_loader or a DistributedSampler with drop_last)"
        )
    return seen


def _describe(seen: dict[int, Arrival]) -> str:
    what = {"final": "finished its loop", "user": "called ray_ormas.report", "periodic": "reached a periodic report"}
    return "; ".join(
        f"rank {r} {what.get(a.kind, a.kind)} after {a.step} monitor steps" for r, a in sorted(seen.items())
    )
