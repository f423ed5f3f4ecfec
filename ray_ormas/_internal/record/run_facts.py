"""The whole run's facts, read from the record: one row per segment, and their totals.

A run is every segment of a monitor under the run's record root: every attempt of every fit that
continued the run (a restart after a failure, or a rerun under the same name and storage). Its
counts are summed over the segments; its state at the end (channels stuck now, the loss now) is
its last segment's with a check in it; its run step is where that segment ended.

A segment that closed states its counts in its `run_end` line (ormas-monitor's own counters). A
segment a crash cut short has no `run_end`: its counts come from its events (each of
ormas-monitor's counters has one kind of event), its checks from its metrics rows, and its steps
are those up to its last check (a lower bound, and marked: `complete` is False).

Summing counts over segments counts again what an attempt redid: a repair made in attempt 0
before a checkpoint that attempt 1 resumed from is counted once; one made after it and made again
in attempt 1 is counted twice, because it happened twice.

Hooks relied on: ormas-monitor's diary (`run_end` with `steps`, `checks`, `counts`; events
`alarm`, `certificate`, `repair` with `count`, `loss_spike`, `nonfinite_loss`,
`nonfinite_gradient`, `skipped_step`), its metrics rows (`step`, `loss`, `stuck`), and the
segment link (record/segments.py: `attempt`, `fit_id`, `step_offset`).
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ray_ormas._internal.common import keys
from ray_ormas._internal.record.layout import DIARY, METRICS, segment_index
from ray_ormas._internal.record.segments import read_link
from ray_ormas._internal.record.store import RecordStore

# The whole run's counts, in this order; each but `checks`, `steps` and `certificates` is one of
# ormas-monitor's counters, read from the events of a segment without a run_end.
COUNTS = (
    "alarms",
    "certificates",
    "repairs",
    "channels_repaired",
    "loss_spikes",
    "nonfinite",
    "skipped_steps",
    "checks",
    "steps",
)
_EVENT_COUNTERS = {
    "alarm": "alarms",
    "repair": "repairs",
    "loss_spike": "loss_spikes",
    "nonfinite_loss": "nonfinite",
    "nonfinite_gradient": "nonfinite",
    "skipped_step": "skipped_steps",
}


@dataclass(frozen=True)
class SegmentFacts:
    """One segment (one attempt of one fit) of a monitor: where it sits in the run and its counts.

    Attributes:
        monitor, segment: the monitor's name and the segment's number (`segment-NNN`).
        attempt: the attempt of its fit (0 first; None when the link does not say).
        metric_prefix: its monitor's report and MLflow prefix (`ormas`, or `ormas/<name>`).
        fit_id: the fit that wrote it.
        step_offset: the run step of its step 0.
        complete: its diary ends with `run_end` (False: a crash cut it short).
        counts: its counts, by the names in `COUNTS`.
        stuck_channels, stuck_layers, loss: at its last check (None: it has no check).
    """

    monitor: str
    segment: int
    attempt: int | None
    fit_id: str | None
    step_offset: int
    complete: bool
    counts: dict[str, int]
    metric_prefix: str = "ormas"
    stuck_channels: int | None = None
    stuck_layers: int | None = None
    loss: float | None = None

    def row(self) -> dict[str, Any]:
        """A flat row: the table `ray-ormas report` prints, and `result.ormas.attempts`."""
        return {
            "monitor": self.monitor,
            "segment": self.segment,
            "attempt": self.attempt,
            "fit_id": self.fit_id,
            "step_offset": self.step_offset,
            "complete": self.complete,
            **self.counts,
            "stuck_channels_at_end": self.stuck_channels,
            "loss_at_end": self.loss,
        }


@dataclass(frozen=True)
class RunFacts:
    """A monitor's whole run: its segments, oldest first, and their totals.

    Attributes:
        monitor: the monitor's name.
        segments: one `SegmentFacts` per segment.
        totals: the counts summed over the segments (`COUNTS`).
        run_step: the run step where its last segment ended (offset + steps).
        stuck_channels, stuck_layers, loss: the state at the end: its last segment's with a check.
    """

    monitor: str
    segments: tuple[SegmentFacts, ...]
    totals: dict[str, int] = field(default_factory=dict)
    run_step: int = 0
    stuck_channels: int | None = None
    stuck_layers: int | None = None
    loss: float | None = None

    @property
    def attempts(self) -> int:
        return len(self.segments)


def run_facts(store: RecordStore, monitor: str) -> RunFacts:
    """The whole run of `monitor` under `store`'s record root."""
    segments = tuple(segment_facts(store, monitor, path) for path in store.segments(monitor))
    totals = {name: sum(s.counts.get(name, 0) for s in segments) for name in COUNTS}
    checked = [s for s in segments if s.loss is not None or s.stuck_channels is not None]
    end = checked[-1] if checked else None
    last = segments[-1] if segments else None
    return RunFacts(
        monitor=monitor,
        segments=segments,
        totals=totals,
        run_step=last.step_offset + last.counts.get("steps", 0) if last is not None else 0,
        stuck_channels=end.stuck_channels if end else None,
        stuck_layers=end.stuck_layers if end else None,
        loss=end.loss if end else None,
    )


def whole_run_counts(store: RecordStore) -> dict[str, int]:
    """Every monitor's whole-run counts as report keys (`<prefix>/alarms`, ..., and
    `<prefix>/segments`): the keys `result.ormas.final` and the MLflow run end with."""
    out: dict[str, int] = {}
    for monitor in store.monitors():
        facts = run_facts(store, monitor)
        if not facts.segments:
            continue
        prefix = facts.segments[-1].metric_prefix
        out.update({f"{prefix}/{name}": facts.totals[name] for name in COUNTS if name != "steps"})
        out[f"{prefix}/{keys.SEGMENTS}"] = facts.attempts
    return out


def state_at_end(store: RecordStore) -> dict[str, Any]:
    """Every monitor's state at the end of the run (its last segment with a check) as report
    keys: `<prefix>/stuck_channels`, `<prefix>/stuck_layers`, `<prefix>/loss`."""
    out: dict[str, Any] = {}
    for monitor in store.monitors():
        facts = run_facts(store, monitor)
        if facts.segments and (facts.loss is not None or facts.stuck_channels is not None):
            prefix = facts.segments[-1].metric_prefix
            out.update(
                {
                    f"{prefix}/{keys.STUCK_CHANNELS}": facts.stuck_channels,
                    f"{prefix}/{keys.STUCK_LAYERS}": facts.stuck_layers,
                    f"{prefix}/{keys.LOSS}": facts.loss,
                }
            )
    return out


def segment_facts(store: RecordStore, monitor: str, path: str) -> SegmentFacts:
    """One segment's facts (see the module docstring for a segment without a run_end)."""
    events = store.read_lines(posixpath.join(path, DIARY))
    rows = store.read_lines(posixpath.join(path, METRICS))
    link = read_link(store, path)
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), None)
    counted: Counter[str] = Counter()
    for e in events:
        name = _EVENT_COUNTERS.get(str(e.get("event")))
        if name is not None:
            counted[name] += 1
        if e.get("event") == "repair":
            counted["channels_repaired"] += int(e.get("count") or 0)
        elif e.get("event") == "certificate":
            counted["certificates"] += 1
    counts = {name: int(counted.get(name, 0)) for name in COUNTS}
    if end is not None:
        stated = end.get("counts") or {}
        counts.update({k: int(v) for k, v in stated.items() if k in counts and isinstance(v, (int, float))})
        counts["checks"] = int(end.get("checks") or len(rows))
        counts["steps"] = int(end.get("steps") or 0)
    else:
        counts["checks"] = len(rows)
        last_step = rows[-1].get("step") if rows else None
        counts["steps"] = int(last_step) + 1 if isinstance(last_step, int) else 0
    last_row = rows[-1] if rows else None
    stuck = (last_row or {}).get("stuck") or {}
    loss = (last_row or {}).get("loss")
    attempt = link.get("attempt")
    return SegmentFacts(
        monitor=monitor,
        segment=segment_index(posixpath.basename(path)) or 0,
        attempt=attempt if isinstance(attempt, int) else None,
        fit_id=link.get("fit_id"),
        step_offset=int(link.get("step_offset") or 0),
        complete=end is not None,
        counts=counts,
        metric_prefix=str(link.get("metric_prefix") or "ormas"),
        stuck_channels=sum(sum(v) for v in stuck.values()) if last_row is not None else None,
        stuck_layers=sum(1 for v in stuck.values() if sum(v)) if last_row is not None else None,
        loss=float(loss) if isinstance(loss, (int, float)) else None,
    )
