"""The parameter digest: a fingerprint of a model's exact bits, so replicas can be compared.

Every rank reports it (worker/reporting.py) and the fleet probe computes it around sampled steps
(worker/fleet_probe.py); the head node compares them (fleet/analysis.py). It is computed on the
parameters' device with one host read per device: per parameter, two int64 checksums of the raw
bits (plain and position-weighted), then sha256 over names, shapes and checksums. Any bit that
differs between two replicas changes it (barring a checksum collision, which no real divergence
produces); it is not a cryptographic hash of the weights. Under FSDP2 each rank digests its own
shards, so the digests differ between ranks by design. torch only.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn as nn

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def parameter_checksums(model: nn.Module, *, gradient_flags: bool = False) -> tuple[list[str], list[torch.Tensor]]:
    """Per parameter, its label (`name:shape:dtype`) and two int64 checksums of its raw bits
    (plain and position-weighted), still on the parameter's device. Under FSDP2, this rank's shard.
    `gradient_flags`: a third int64 per parameter, 0 when its gradient has a non-finite value."""
    labels, sums = [], []
    for name, p in model.named_parameters():
        t = p.detach()
        if callable(getattr(t, "to_local", None)):  # FSDP2 (DTensor): this rank's shard
            t = t.to_local()
        if t.is_complex():
            t = torch.view_as_real(t)
        t = t.contiguous().reshape(-1)
        if t.numel() == 0:
            continue
        bits = t.view(_INT_OF_SIZE[t.element_size()]).to(torch.int64)
        weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64)
        labels.append(f"{name}:{tuple(p.shape)}:{p.dtype}")
        row = [bits.sum(), (bits * weights).sum()]
        if gradient_flags:
            row.append(_finite_flag(p.grad, bits.device))
        sums.append(torch.stack(row))
    return labels, sums


def _finite_flag(grad: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """1 (int64, on `device`) when `grad` is None or all finite, else 0. The norm is non-finite
    exactly when some value is (or the norm overflows float32, which is as bad)."""
    if grad is None:
        return torch.ones((), dtype=torch.int64, device=device)
    g = grad.to_local() if callable(getattr(grad, "to_local", None)) else grad
    if g.layout != torch.strided:
        g = g.coalesce().values() if g.layout == torch.sparse_coo else g.values()
    return torch.isfinite(torch.linalg.vector_norm(g, dtype=torch.float32)).to(device=device, dtype=torch.int64)


def digest_of(labels: list[str], sums: list[bytes]) -> str:
    """The 16-hex-digit digest of parameters from their labels and their checksums' bytes."""
    h = hashlib.sha256("|".join(labels).encode())
    for s in sums:
        h.update(s)
    return h.hexdigest()[:16]


def read_per_device(values: list[torch.Tensor]) -> list[Any]:
    """`values` (equal-shaped tensors, possibly on several devices) read to the host with one
    transfer per device, in their order, as numpy arrays."""
    by_device: dict[str, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(str(v.device), []).append(i)
    out: list[Any] = [None] * len(values)
    for idx in by_device.values():
        host = torch.stack([values[i] for i in idx]).cpu().numpy()
        for i, row in zip(idx, host):
            out[i] = row
    return out


def parameter_digest(model: nn.Module) -> str:
    """A 16-hex-digit digest of every parameter's exact bits, computed on device, one host read
    per device."""
    labels, sums = parameter_checksums(model)
    return digest_of(labels, [row[:2].tobytes() for row in read_per_device(sums)])
