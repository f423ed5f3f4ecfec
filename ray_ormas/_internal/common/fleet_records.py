"""The fleet's typed records: what crosses from the analysis to the head, from the head to a
user's policy and to the ranks, and what the fleet record's lines are made from.

    fleet/analysis.py, fleet/stall.py -> `RankRow` (one rank at one check), `FleetAlarm`
    head/policy_runner.py             -> `FleetAlarm` (kind "policy"); the policy reads `RankRow`s and `FleetAlarm`s
    fleet/actions.py                  -> `ActionLine` (what an alarm's action was decided to be)
    head/fleet_actions.py             -> `ActionOutcome` (what became of it), `StackLine`, `Order`
    worker/fleet_probe.py             <- `Order` (the answer to a rank's `fleet_facts` call)

Every record is a frozen dataclass; a changed copy is `dataclasses.replace(record, ...)`.
`to_line()` is the record as a line of the fleet record (record/fleet_record.py): the fields it
always had, plus each optional field that is set, so that a line reads as the lines this
ray-ormas wrote before the records were typed. The fleet record's format has a version
(record/fleet_record.py `FLEET_RECORD_VERSION`, in its `fleet.json`); a change to these lines that
an older reader would misread takes a new one (as the tracking journal's, tracking/journal.py).

`RankRow` and `FleetAlarm` also answer `row["rank"]` and `row.get("slow")`, as the dicts a policy
received before: a policy written then keeps working. New code reads attributes.

Plain Python, no Ray, no torch. Hooks relied on: none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from ray_ormas.errors import UsageError

OrderAction = Literal["reattempt", "stop"]


class _ReadsLikeAMapping:
    """`record["name"]` and `record.get("name", default)`: the attributes, read as the dicts that
    policies received before the records were typed."""

    def __getitem__(self, name: str) -> Any:
        if not self._has(name):
            fields_ = ", ".join(sorted(_names(type(self))))
            raise UsageError(f"a {type(self).__name__} has no field {name!r}; its fields are {fields_}")
        value = getattr(self, name)
        return list(value) if isinstance(value, tuple) else value

    def get(self, name: str, default: Any = None) -> Any:
        """The field `name`, or `default` when there is no such field."""
        return self[name] if self._has(name) else default

    def _has(self, name: Any) -> bool:
        return isinstance(name, str) and name in _names(type(self))


def _names(cls: type) -> frozenset[str]:
    return frozenset(_ordered_names(cls))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _ordered_names(cls: type) -> tuple[str, ...]:
    """The dataclass `cls`'s field names, in order (read once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _line(record: Any, always: tuple[str, ...]) -> dict[str, Any]:
    """`record` as a JSON-ready dict: the `always` fields, then every other field that is set
    (tuples as lists). Called for every rank at every check: the field names are read once."""
    line: dict[str, Any] = {}
    for name in _ordered_names(type(record)):
        value = getattr(record, name)
        if value is None and name not in always:
            continue
        line[name] = list(value) if isinstance(value, tuple) else value
    return line


@dataclass(frozen=True)
class RankRow(_ReadsLikeAMapping):
    """One rank at one complete check, as the fleet record's `checks.jsonl` keeps it.

    Attributes:
        rank: the rank within its attempt.
        node: the node it runs on (hostname).
        data_s, forward_s, wall_s: its median seconds per step over the timed steps up to this
            check, waiting for data, in the forward pass, and in all (None: not timed).
        timed_steps: how many steps those medians are over (check_every, at most 8).
        loss: its latest loss (None: not reported).
        nonfinite: whether its loss or a gradient was NaN or infinite.
        digest: its parameters' digest (DDP replicas agree on it).
        relative_score: the other ranks' median busy time over its own (1: as fast as them).
        individual_score: its own best busy time over its current one (1: as fast as it was).
        slow: whether it was slow at this check.
        slow_in: "data" or "compute", when slow.
    """

    rank: int
    node: str | None = None
    data_s: float | None = None
    forward_s: float | None = None
    wall_s: float | None = None
    timed_steps: int | None = None
    loss: float | None = None
    nonfinite: bool = False
    digest: str | None = None
    relative_score: float | None = None
    individual_score: float | None = None
    slow: bool = False
    slow_in: str | None = None

    def to_line(self) -> dict[str, Any]:
        """The row as a line of `checks.jsonl` (without the check's place)."""
        return _line(self, RANK_ROW_FIELDS)


RANK_ROW_FIELDS = tuple(f.name for f in fields(RankRow))


@dataclass(frozen=True)
class FleetAlarm(_ReadsLikeAMapping):
    """What the fleet saw that is not right, as the fleet record's `alarms.jsonl` keeps it.

    Attributes:
        kind: "straggler", "straggler_recovered", "divergence", "divergence_resolved",
            "nonfinite", "hang", "nccl_hang", "unreadable" or "policy".
        message: what happened, in words.
        attempt, check, step, run_step: where (None where it is not known: a hang Ray's detector
            reported has no check).
        ranks: the ranks it names.
        node: their node(s), comma-separated.
        time: when the head raised it (Unix seconds).
        slow_in, relative_score, individual_score: a straggler's.
        layer: the first layer that differs (divergence) or holds a non-finite gradient.
        layers: every layer with a non-finite gradient; `source`: "loss" or "gradients".
        reached: the ranks that did reach the stalled check (a hang).
        chain: the actions a policy asked for (a `policy` alarm).
        requested, bounded_by: the actions the settings asked for, and why a bound changed them
            (an evict that would reach every rank diagnoses and reattempts instead).
    """

    kind: str
    message: str
    attempt: int | None = None
    check: int | None = None
    step: int | None = None
    run_step: int | None = None
    ranks: tuple[int, ...] = ()
    node: str | None = None
    time: float = 0.0
    slow_in: str | None = None
    relative_score: float | None = None
    individual_score: float | None = None
    layer: str | None = None
    layers: tuple[str, ...] | None = None
    source: str | None = None
    reached: tuple[int, ...] | None = None
    chain: tuple[str, ...] | None = None
    requested: tuple[str, ...] | None = None
    bounded_by: str | None = None

    def to_line(self) -> dict[str, Any]:
        """The alarm as a line of `alarms.jsonl`."""
        return _line(self, ALARM_FIELDS)


ALARM_FIELDS = ("attempt", "check", "step", "run_step", "kind", "ranks", "node", "message", "time")


@dataclass(frozen=True)
class ActionLine:
    """What an alarm's action was decided to be (fleet/actions.py), as `actions.jsonl` keeps it.

    `action` is the one carried out (after the stacks, when `diagnose`); `requested` the chain
    the settings or the policy asked for; `outcome` "requested" (it is carried out), "bounded",
    "skipped", "superseded" or "failed" (it only logs, `reason` says why); `checkpoint` the one a
    restart was chosen to resume from, `why` chosen."""

    id: int
    alarm: str
    requested: tuple[str, ...]
    action: str
    diagnose: bool
    outcome: str
    attempt: int | None = None
    run_step: int | None = None
    ranks: tuple[int, ...] = ()
    node: str | None = None
    time: float = 0.0
    reason: str | None = None
    checkpoint: str | None = None
    checkpoint_run_step: int | None = None
    why: str | None = None

    def to_line(self) -> dict[str, Any]:
        """The decision as a line of `actions.jsonl`."""
        return _line(self, ACTION_FIELDS)


ACTION_FIELDS = ("id", "alarm", "requested", "attempt", "run_step", "ranks", "node", "time", "action", "diagnose")


@dataclass(frozen=True)
class ActionOutcome:
    """What became of action `id`, as `actions.jsonl` keeps it (`"event": "outcome"`): its
    `outcome` ("done", "failed", "not carried out"), the `reason`, the `seconds` from the alarm
    to training again, where the group resumed (`resumed_run_step`, `resumed_from`), the nodes
    an evict took out (`evicted`, `evicted_ids`, `scope`), the action it fell back to, and what
    a diagnose read (`diagnosed`)."""

    id: int
    outcome: str | None = None
    reason: str | None = None
    seconds: float | None = None
    resumed_run_step: int | None = None
    resumed_from: str | None = None
    evicted: tuple[str, ...] | None = None
    evicted_ids: tuple[str, ...] | None = None
    scope: str | None = None
    action: str | None = None
    diagnosed: str | None = None

    def to_line(self) -> dict[str, Any]:
        """The outcome as a line of `actions.jsonl`."""
        return {"event": "outcome", **_line(self, ("id",))}


@dataclass(frozen=True)
class StackLine:
    """One rank's Python stacks, as a `diagnose` action captured them (`stacks.jsonl`)."""

    id: int
    rank: int
    node: str
    stack: str

    def to_line(self) -> dict[str, Any]:
        """The stacks as a line of `stacks.jsonl`."""
        return _line(self, ("id", "rank", "node", "stack"))


@dataclass(frozen=True)
class Order:
    """What every rank of an attempt does at its next check: raise `FleetReattemptError`
    ("reattempt") or `FleetStopError` ("stop") with `message`, for action `id`."""

    action: OrderAction
    message: str
    id: int


FleetLine = RankRow | FleetAlarm | ActionLine | ActionOutcome | StackLine
