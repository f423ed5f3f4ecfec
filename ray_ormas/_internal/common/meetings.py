"""What a rank says at a meeting of the run ledger (head/ledger.py).

Shared by both sides of the meeting: the workers arrive (worker/rendezvous.py), the ledger actor
on the head node keeps the arrivals. Plain Python; no Ray.
"""

from __future__ import annotations

from typing import NamedTuple


class Arrival(NamedTuple):
    """What one rank said at a meeting: which report, after how many monitor steps, and whether
    it reports a checkpoint (then rank 0 persists the record first; see worker/session.py)."""

    kind: str
    step: int
    checkpoint: bool = False
