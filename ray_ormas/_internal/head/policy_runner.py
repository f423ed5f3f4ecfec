"""The user's fleet policy, called on the head node at every complete check (inside the run ledger).

    FleetHead.facts (a check complete) -> PolicyRunner.consult -> a `policy` alarm when the policy
                                          asks for something (its chain rides on the alarm: the
                                          fleet head's actions carry it out, head/fleet_actions.py)

The runner builds the `FleetView` (common/fleet_policy.py) with every rank's row of the check,
the fit's alarms so far and the policy's own `memory`, kept for the whole fit. The policy runs in
a thread of its own and has POLICY_LIMIT_S to answer. A policy that raises, overruns its limit,
or returns something other than a `FleetAction` or None, is named once as a `policy` alarm (its
error, or its limit) and not called again in the fit, and that check only logs: the user's rule
never takes the ledger down or holds it up.

Hooks relied on: none (the user's function, called in this process).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ray_ormas._internal.common.fleet_policy import FleetAction, FleetView, policy_name
from ray_ormas._internal.common.fleet_records import FleetAlarm
from ray_ormas._internal.fleet.analysis import CheckOutcome
from ray_ormas.errors import OptionTypeError

POLICY_LIMIT_S = 10.0  # the longest a policy may take to answer at one check


def _answer(policy: Callable[..., Any], view: FleetView, answer: list[Any]) -> None:
    """The policy's answer, or what it raised, into `answer`."""
    try:
        answer.append(policy(view))
    except BaseException as e:  # said by the runner, with the policy's name
        answer.append(e)


class PolicyRunner:
    """One fit's policy (see the module docstring)."""

    def __init__(self, policy: Callable[..., Any]) -> None:
        self._policy: Callable[..., Any] | None = policy
        self._name = policy_name(policy)
        self._memory: dict[str, Any] = {}

    def consult(self, check: CheckOutcome, alarms: tuple[FleetAlarm, ...], now: float) -> list[FleetAlarm]:
        """The policy at one complete check (`alarms`: the fit's so far): its alarm, when it asks
        for more than nothing."""
        if self._policy is None:
            return []
        where: dict[str, Any] = {
            "attempt": check.attempt,
            "check": check.check,
            "step": check.step,
            "run_step": check.run_step,
        }
        view = FleetView(**where, ranks=tuple(check.ranks), alarms=alarms, memory=self._memory)
        answer: list[Any] = []
        policy = self._policy
        worker = threading.Thread(target=_answer, args=(policy, view, answer), name="ray-ormas-policy", daemon=True)
        worker.start()
        worker.join(POLICY_LIMIT_S)
        if not answer:  # still running: it is left to finish alone, and never asked again
            return self._given_up(where, now, f"gave no answer within {POLICY_LIMIT_S:g} s (its time limit)")
        asked = answer[0]
        if isinstance(asked, BaseException):
            return self._given_up(where, now, f"raised {type(asked).__name__}: {asked}")
        if asked is None:
            return []
        try:
            if not isinstance(asked, FleetAction):
                raise OptionTypeError(f"returned {type(asked).__name__}; return a ray_ormas.FleetAction or None")
            chain = asked.chain()
            ranks = tuple(int(r) for r in asked.ranks)
        except Exception as e:  # the user's rule must not take the ledger down
            return self._given_up(where, now, f"raised {type(e).__name__}: {e}")
        nodes = {r.rank: r.node for r in check.ranks}
        return [
            FleetAlarm(
                **where,
                kind="policy",
                ranks=ranks,
                node=nodes.get(ranks[0]) if ranks else None,
                chain=chain,
                message=f"{self._name} asks to {' then '.join(chain)} on ranks {list(ranks)}: {asked.reason}",
                time=now,
            )
        ]

    def _given_up(self, where: dict[str, Any], now: float, what: str) -> list[FleetAlarm]:
        """The policy failed (`what` it did): named in a `policy` alarm that asks for nothing (the
        check only logs), and not called again in the fit."""
        self._policy = None
        message = f"the policy {self._name} {what}; it is not called again in this fit"
        return [FleetAlarm(**where, kind="policy", message=message, time=now)]
