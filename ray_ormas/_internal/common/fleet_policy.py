"""Your own rule for the fleet: a function the head node calls at every complete check.

    def my_rule(view: ray_ormas.FleetView) -> ray_ormas.FleetAction | None: ...
    RayOrmasTrainer(loop, fleet=FleetSettings(policy=my_rule))        # or policy="my_pkg.rules:my_rule"

The function runs in the run ledger actor, on the head node (head/fleet_actions.py), so it must
be picklable (a module-level function, or any function cloudpickle takes) and quick: the head
calls it once per complete check, in the order of the checks. What it returns goes through the
same rules as an alarm's action (fleet/actions.py: `max_actions`, one action per attempt) and
shows as a `policy` alarm with its reason. The view is built for the call; `memory` is the
policy's own dict, kept from one call to the next for the whole fit. docs/fleet-health.md has a
worked example.

Plain Python: the types here are checked on the driver (a policy that is not callable, an
action that is not one) and built on the head. `check_chain` is the one check of an action (or a
chain of them), for `FleetSettings.actions` and a policy's answer alike.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ray_ormas._internal.common.fleet_records import FleetAlarm, RankRow
from ray_ormas.errors import OptionError

Policy = Callable[["FleetView"], "FleetAction | None"]
ACTIONS = ("log", "reattempt", "evict", "stop", "diagnose")


@dataclass(frozen=True)
class FleetView:
    """What a policy sees at one complete check.

    Attributes:
        attempt: the worker-group attempt (0, 1, ... after restarts).
        check: the monitor's check index within the attempt.
        step: the attempt's step of the check; `run_step` is the run's (across restarts).
        ranks: one `RankRow` per rank at this check, as in the fleet record's `checks.jsonl`:
            `rank`, `node`, `data_s`, `forward_s`, `wall_s`, `timed_steps`, `loss`, `nonfinite`,
            `digest`, `relative_score`, `individual_score`, `slow`, `slow_in` (`row.slow`;
            `row["slow"]` still reads it, as when the rows were dicts).
        alarms: every `FleetAlarm` of the fit so far, oldest first (`kind`, `ranks`, `node`,
            `run_step`, `message`, ...).
        memory: the policy's own dict, the same object at every call of the fit.
    """

    attempt: int
    check: int
    step: int
    run_step: int
    ranks: tuple[RankRow, ...]
    alarms: tuple[FleetAlarm, ...]
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetAction:
    """What a policy asks for: an action (as in `FleetSettings.actions`: "log", "reattempt",
    "evict", "stop", "diagnose", or ["diagnose", then]) on the named ranks, with the reason it
    gives. `evict` keeps the named ranks' nodes out of the run (`FleetSettings.evict_scope`), within
    the same bounds as an alarm's."""

    action: str | tuple[str, ...] | list[str]
    ranks: tuple[int, ...] | list[int] = ()
    reason: str = ""

    def chain(self) -> tuple[str, ...]:
        """The action as a checked chain (the same rules as `FleetSettings.actions`)."""
        return check_chain("policy", self.action)


def resolve_policy(value: Any) -> Policy | None:
    """A callable, or "module:function" imported now (on the driver): the policy; None: none."""
    if value is None or callable(value):
        return value
    if not isinstance(value, str) or value.count(":") != 1:
        raise OptionError(f"must be a function (view -> FleetAction or None) or 'module:function', got {value!r}")
    module, name = value.split(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise OptionError(f"cannot import {value!r}: {type(e).__name__}: {e}") from None
    if not callable(found):
        raise OptionError(f"{value!r} is a {type(found).__name__}, not a function")
    return found


def policy_name(policy: Any) -> str | None:
    """ "module:function" of a policy, as the fleet record's settings show it."""
    if policy is None:
        return None
    return f"{getattr(policy, '__module__', '?')}:{getattr(policy, '__qualname__', type(policy).__name__)}"


def check_chain(kind: str, given: Any) -> tuple[str, ...]:
    """`given` (an action or a list of them) as a checked chain, errors said for `kind`."""
    chain = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, (list, tuple)) else None
    if not chain or not all(isinstance(a, str) for a in chain):
        raise OptionError(
            f"{kind}: give an action or a list of them, e.g. 'reattempt' or ['diagnose', 'stop'], got {given!r}"
        )
    for action in chain:
        if action not in ACTIONS:
            raise OptionError(f"{kind}: unknown action {action!r}; the actions are {', '.join(ACTIONS)}")
    if len(chain) > 2 or (len(chain) == 2 and (chain[0] != "diagnose" or chain[1] == "diagnose")):
        raise OptionError(
            f"{kind}: {list(chain)} is not a chain of actions: give one action, or 'diagnose' and then "
            f"one other, e.g. ['diagnose', 'reattempt']"
        )
    return chain
