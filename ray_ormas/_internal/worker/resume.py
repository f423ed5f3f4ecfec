"""Where a restarted attempt resumes from, and the errors a rank raises for the head's orders.

When an alarm's action restarts the group after the replicas diverged or a loss stopped being
finite (head/fleet_actions.py), the checkpoint to resume from is the last one taken while every
check was clean, which need not be Ray's latest. `start_checkpoint()` is the one place that
answers "which checkpoint does this attempt start from": the ledger's choice when it has one,
else `ray.train.get_checkpoint()`. `ray_ormas.load_checkpoint()` and the record's link between
segments (worker/session.py) both read it, so the restored state and the run step agree.

The session sets the ledger to ask with `use_ledger` at the start of each attempt (only when an
alarm can act), with the attempt's token; the answer is read once per rank and attempt, with one
actor call, and the ledger gives every rank of an attempt the same answer (decided at the first
rank's question): ranks that started from different checkpoints would run different steps and
wait on each other's collectives forever.

Hooks relied on: `ray.train.get_checkpoint`, the run ledger's `resume_from` (head/ledger.py).
"""

from __future__ import annotations

from typing import Any

import ray
import ray.train

from ray_ormas._internal.common.fleet_records import Order
from ray_ormas.errors import FleetReattemptError, FleetStopError

ASK_TIMEOUT_S = 60.0
_UNSET = object()
_ledger: Any = None
_token: str | None = None
_answer: Any = _UNSET


def use_ledger(ledger: Any, token: str | None = None) -> None:
    """This attempt (`token`) asks `ledger` (None: Ray's latest checkpoint, always)."""
    global _ledger, _token, _answer
    _ledger, _token, _answer = ledger, token, _UNSET


def start_checkpoint() -> ray.train.Checkpoint | None:
    """The checkpoint this attempt starts from: the fleet's choice, else Ray's latest (None on a
    fresh start)."""
    global _answer
    if _ledger is not None and _answer is _UNSET:
        try:
            _answer = ray.get(_ledger.resume_from.remote(_token), timeout=ASK_TIMEOUT_S)
        except Exception:  # no answer: Ray's latest, as without actions
            _answer = None
    chosen = None if _answer is _UNSET else _answer
    return chosen if chosen is not None else ray.train.get_checkpoint()


def order_error(order: Order) -> Exception:
    """The error a rank raises for the head's order (its message says why)."""
    if order.action == "stop":
        return FleetStopError(order.message)
    return FleetReattemptError(order.message)
