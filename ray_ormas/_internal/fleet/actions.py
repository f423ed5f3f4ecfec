"""What an alarm does: the head's decision for each alarm, bounded, and the checkpoint a restart
resumes from.

Pure Python, no Ray, no torch: the fleet head (head/fleet_head.py) asks `ActionPlanner.decide` for
every alarm it emits and carries out what comes back (head/fleet_actions.py); `CheckpointBook`
keeps every checkpoint the fit reported and which of them were taken after the replicas stopped
agreeing or a loss stopped being finite, so that a restart never resumes from those.

The rules (docs/fleet-health.md, "When the fleet acts"):

* an alarm's actions are `FleetSettings.action_for(kind)` (a `policy` alarm carries the chain its
  policy asked for): ("log",) does nothing more;
* at most `max_actions` actions per fit; after that an alarm only logs, and its line says why;
* one action per attempt: once an attempt is being restarted or stopped, its later alarms log;
* one decision per check: of the alarms that come together (a check's, and its policy's), the
  one whose action is the most severe is carried out (`SEVERITY`: stop > evict > reattempt >
  diagnose > log; the first of equals); each other one is recorded with the action it asked for,
  as `superseded`;
* `evict` is a `reattempt` on other nodes: it chooses its checkpoint the same way;
* `reattempt` after a `divergence` or `nonfinite` alarm resumes from the last checkpoint taken no
  later than the last check at which every rank's digest agreed and every loss was finite; when
  there is none, the action falls back to `log` and says so (restarting would replay the damage,
  or throw away the whole run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from ray_ormas._internal.common.fleet_records import ActionLine, FleetAlarm
from ray_ormas._internal.common.fleet_settings import FleetSettings

DAMAGE_KINDS = ("divergence", "nonfinite")  # alarms whose later checkpoints are not resumed from
RESTARTS = ("reattempt", "evict")  # the actions that restart the worker group
SEVERITY = {"log": 0, "diagnose": 1, "reattempt": 2, "evict": 3, "stop": 4}  # the most severe is carried out


def severity(chain: tuple[str, ...]) -> int:
    """How severe a chain of actions is: its last action's (a diagnose alone is a diagnose)."""
    return SEVERITY[chain[-1]]


@dataclass
class _Book:
    run_step: int
    attempt: int
    checkpoint: Any  # a ray.train.Checkpoint (opaque here); None until Ray registers it
    suspect: bool = False


@dataclass
class CheckpointBook:
    """Every checkpoint the fit reported, in order, and each attempt's last clean check.

    A checkpoint is judged by its run step within its attempt, not by when Ray's controller
    registered it (which can come after the next checks): it is suspect when it was taken after
    the attempt's last clean check and a later check of that attempt was not clean."""

    _books: list[_Book] = field(default_factory=list)
    _clean_through: dict[int, int] = field(default_factory=dict)  # attempt -> run step of its last clean check
    _dirty: set[int] = field(default_factory=set)  # attempts whose latest complete check was not clean

    @property
    def clean_through(self) -> int | None:
        """The run step of the latest clean check (of the latest attempt that had one)."""
        return self._clean_through[max(self._clean_through)] if self._clean_through else None

    def checked(self, attempt: int, run_step: int, clean: bool) -> None:
        """A complete check: were the digests in agreement and every loss finite?"""
        if clean:
            self._clean_through[attempt] = run_step
            self._dirty.discard(attempt)
        else:
            self._dirty.add(attempt)

    def announced(self, attempt: int, run_step: int) -> None:
        """The ranks met to report a checkpoint at `run_step` (before Ray registers it)."""
        if not any(b.attempt == attempt and b.run_step == run_step for b in self._books):
            self._books.append(self._judged(_Book(run_step, attempt, None)))

    def taken(self, run_step: int, attempt: int, checkpoint: Any) -> None:
        """Ray registered a checkpoint reported at `run_step` of `attempt`."""
        for b in self._books:
            if b.attempt == attempt and b.run_step == run_step and b.checkpoint is None:
                b.checkpoint = checkpoint
                return
        self._books.append(self._judged(_Book(run_step, attempt, checkpoint)))

    def _judged(self, book: _Book) -> _Book:
        book.suspect = book.attempt in self._dirty and book.run_step > self._clean_through.get(book.attempt, -1)
        return book

    def damaged(self, attempt: int) -> None:
        """A divergence or non-finite alarm in `attempt`: its checkpoints after its last clean
        check are suspect."""
        self._dirty.add(attempt)
        for b in self._books:
            if b.attempt == attempt and b.run_step > self._clean_through.get(attempt, -1):
                b.suspect = True

    def at_risk(self) -> Any:
        """The checkpoint a restart after damage would resume from while a check of the latest
        attempt is not clean (the latest registered one that is not suspect), else None: Ray
        may delete it (`num_to_keep`) as the suspect ones come."""
        if not self._books or self._books[-1].attempt not in self._dirty:
            return None
        good = [b for b in self._books if not b.suspect and b.checkpoint is not None]
        return good[-1].checkpoint if good else None

    def last_good(self) -> tuple[int, Any] | None:
        """(run step, checkpoint) of the latest checkpoint that is not suspect."""
        good = [b for b in self._books if not b.suspect]
        return (good[-1].run_step, good[-1].checkpoint) if good else None

    def latest(self) -> tuple[int, Any] | None:
        """(run step, checkpoint) of the latest checkpoint reported (Ray's latest)."""
        return (self._books[-1].run_step, self._books[-1].checkpoint) if self._books else None

    def at_run_step(self, run_step: int) -> Any:
        """The latest registered checkpoint reported at `run_step` (None: none)."""
        found = [b.checkpoint for b in self._books if b.run_step == run_step and b.checkpoint is not None]
        return found[-1] if found else None

    def resume_override(self) -> Any:
        """The checkpoint a restart must resume from when it is not Ray's latest (None: Ray's
        latest, or no checkpoint at all, or one Ray has not registered)."""
        registered = [b for b in self._books if b.checkpoint is not None]
        if not registered or not registered[-1].suspect:
            return None
        good = [b for b in registered if not b.suspect]
        return good[-1].checkpoint if good else None


@dataclass
class ActionPlanner:
    """Decides what each alarm does (see the module docstring)."""

    settings: FleetSettings
    taken: int = 0
    _acted_attempts: set[int] = field(default_factory=set)
    _next_id: int = 0

    def chain_of(self, alarm: FleetAlarm) -> tuple[str, ...]:
        """The actions `alarm` asks for: its policy's chain, or its kind's in the settings."""
        return alarm.chain if alarm.chain else self.settings.action_for(alarm.kind)

    def decide_check(self, alarms: list[FleetAlarm]) -> list[tuple[ActionLine, FleetAlarm]]:
        """The action lines of alarms that came together, with their alarms: the most severe one's
        as `decide` gives it, first, then every other alarm that asked for more than logging, as
        `superseded` (it logs; it does not count against `max_actions`)."""
        asking = [a for a in alarms if self.chain_of(a) != ("log",)]
        if not asking:
            return []
        first = max(asking, key=lambda a: severity(self.chain_of(a)))  # max keeps the first of equals
        lines = []
        chosen = self.decide(first)
        if chosen is not None:
            lines.append((chosen, first))
        winner = self.chain_of(first)[-1]
        for alarm in asking:
            if alarm is first:
                continue
            self._next_id += 1
            line = self._line(
                alarm,
                self.chain_of(alarm),
                action="log",
                outcome="superseded",
                reason=f"the {first.kind} alarm's {winner} at the same check comes first "
                f"(stop > evict > reattempt > diagnose > log): only logged",
            )
            lines.append((line, alarm))
        return lines

    def _line(
        self, alarm: FleetAlarm, chain: tuple[str, ...], action: str, outcome: str, diagnose: bool = False, **more: Any
    ) -> ActionLine:
        return ActionLine(
            id=self._next_id,
            alarm=alarm.kind,
            requested=alarm.requested or chain,  # the chain the settings gave, before a bound changed it
            action=action,
            diagnose=diagnose,
            outcome=outcome,
            attempt=alarm.attempt,
            run_step=alarm.run_step,
            ranks=alarm.ranks,
            node=alarm.node,
            time=round(time.time(), 3),
            **more,
        )

    def decide(self, alarm: FleetAlarm) -> ActionLine | None:
        """The action line of `alarm` (its `action` the one to carry out, `diagnose` whether stacks
        are captured first), or None when the alarm only logs as it always did."""
        chain = self.chain_of(alarm)
        if chain == ("log",):
            return None
        self._next_id += 1
        if self.taken >= self.settings.max_actions:
            reason = f"max_actions ({self.settings.max_actions}) already taken in this fit: only logged"
            return self._line(alarm, chain, action="log", outcome="bounded", reason=reason)
        if alarm.attempt in self._acted_attempts:
            reason = f"attempt {alarm.attempt} is already being acted on: only logged"
            return self._line(alarm, chain, action="log", outcome="skipped", reason=reason)
        self.taken += 1
        final = chain[-1] if chain[-1] != "diagnose" else "log"
        if final in RESTARTS + ("stop",):
            self._acted_attempts.add(alarm.attempt if alarm.attempt is not None else -1)
        # `bounded_by`: why the chain is not the one the settings gave
        return self._line(
            alarm, chain, action=final, outcome="requested", diagnose=chain[0] == "diagnose", reason=alarm.bounded_by
        )

    def released(self, attempt: int | None) -> None:
        """The action on `attempt` fell back to logging: it does not count against `max_actions`,
        and a later alarm of that attempt may act."""
        self.taken -= 1
        self._acted_attempts.discard(attempt if attempt is not None else -1)


def fall_back(line: ActionLine, reason: str) -> ActionLine:
    """An action that could not be carried out: it logs instead, and says why."""
    return replace(line, action="log", outcome="failed", reason=reason)
