"""A rank's fleet facts in 49 bytes: what a node's relay sends the head for each of its ranks.

No Ray, no torch (struct, and numpy's view of the same rows). The node's relay
(node/fleet_relay.py) packs the `RankFacts` its ranks hand it and sends a check's rows as one
`bytes`; the head's analysis reads them as columns (`ROW_DTYPE`, fleet/check_columns.py), or one
rank's back as `RankFacts` (`unpack`). Fixed width, little-endian:

    rank u32 | check u32 | step i64 | data_s, forward_s, wall_s f32 | loss f64 |
    timed_steps, forwards u16 | flags u8 | digest 8 bytes

A missing timing is a float NaN; `flags` says whether the loss and the digest are there and
whether the loss is not finite. What does not change within an attempt goes once per rank (an
`Intro`: the world size, the node, the parameter groups' names), and what is rare or needed only
sometimes goes beside the rows (`extras`: the layers with a non-finite gradient; a digest that is
not 16 hex digits). The parameter groups' digests never go with the rows: the head asks the
relay for them when the replicas' digests differ (head/fleet_head.py).

Hooks relied on: none.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ray_ormas._internal.fleet.facts import RankFacts

ROW = struct.Struct("<IIqfffdHHB8s")  # 49 bytes
ROW_DTYPE = np.dtype(  # the same row, as numpy reads many at once (tests/test_fleet_wire.py: alike)
    [
        ("rank", "<u4"),
        ("check", "<u4"),
        ("step", "<i8"),
        ("data_s", "<f4"),
        ("forward_s", "<f4"),
        ("wall_s", "<f4"),
        ("loss", "<f8"),
        ("timed_steps", "<u2"),
        ("forwards", "<u2"),
        ("flags", "u1"),
        ("digest", "<u8"),
    ]
)
LOSS, NONFINITE_LOSS, DIGEST = 1, 2, 4  # flags
_U16 = 0xFFFF
_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Intro:
    """What a rank's rows leave out, sent once per attempt: its world size, node and the names
    of its parameter groups."""

    world: int | None
    node: str | None
    group_names: tuple[tuple[str, str], ...] | None


def intro_of(facts: RankFacts) -> Intro:
    return Intro(facts.world, facts.node, facts.group_names)


def pack(facts: RankFacts) -> tuple[bytes, dict[str, Any] | None]:
    """(the fixed row, the extras or None) of one rank's facts; the groups are left out."""
    flags = 0
    if facts.loss is not None:
        flags |= LOSS
    if facts.nonfinite_loss:
        flags |= NONFINITE_LOSS
    extras: dict[str, Any] = {}
    digest = b"\0" * 8
    if facts.digest is not None:
        try:
            digest = bytes.fromhex(facts.digest) if len(facts.digest) == 16 else b""
        except ValueError:
            digest = b""
        if len(digest) == 8:
            flags |= DIGEST
        else:
            extras["digest"], digest = facts.digest, b"\0" * 8
    if facts.nonfinite_layers:
        extras["layers"] = facts.nonfinite_layers
    row = ROW.pack(
        facts.rank,
        facts.check,
        facts.step,
        _f(facts.data_s),
        _f(facts.forward_s),
        _f(facts.wall_s),
        facts.loss if facts.loss is not None else _NAN,
        min(facts.timed_steps, _U16),
        min(facts.forwards, _U16),
        flags,
        digest,
    )
    return row, extras or None


def unpack(row: bytes, intro: Intro | None, extras: Mapping[str, Any] | None) -> RankFacts:
    """The `RankFacts` of a packed row (timings as float32 kept them), with its rank's intro."""
    rank, check, step, data, forward, wall, loss, timed, forwards, flags, digest = ROW.unpack(row)
    extras = extras or {}
    return RankFacts(
        rank=rank,
        check=check,
        step=step,
        world=intro.world if intro else None,
        node=intro.node if intro else None,
        data_s=None if math.isnan(data) else data,
        forward_s=None if math.isnan(forward) else forward,
        wall_s=None if math.isnan(wall) else wall,
        timed_steps=timed,
        forwards=forwards,
        loss=loss if flags & LOSS else None,
        nonfinite_loss=bool(flags & NONFINITE_LOSS),
        nonfinite_layers=tuple(extras.get("layers", ())),
        digest=digest.hex() if flags & DIGEST else extras.get("digest"),
        group_names=intro.group_names if intro else None,
    )


def rows_at(packed: bytes) -> tuple[int, int, list[int]]:
    """(the check, its step, the ranks) of a node's rows at one check, packed one after another."""
    rows = list(ROW.iter_unpack(packed))
    return (rows[0][1], rows[0][2], [row[0] for row in rows]) if rows else (-1, 0, [])


def as_sent(facts: RankFacts) -> RankFacts:
    """`facts` as the head reads them after the wire: what `unpack(pack(...))` gives, groups
    left out (for a replay through both paths)."""
    row, extras = pack(facts)
    return replace(unpack(row, intro_of(facts), extras), group_names=facts.group_names)


def _f(x: float | None) -> float:
    return _NAN if x is None else x
