"""The end-of-run summary `ray-ormas train` prints: per monitor, per layer, what the record says.

    monitor 'model': 7 layers, 5 healthy (the whole run: 2 segments, 12 checks, to run step 48)
      layer      alarms  certified  repaired  stuck at end  status
      conv2.0         0         32        32             0  repaired
      conv3.0         0         64         0            64  certified dead

Read from the record itself, in storage, so the table is what anyone re-reading the record would
find. It covers the whole run: alarms, certificates and repairs summed over every segment of the
monitor (every attempt, every earlier fit this one continued; record/run_facts.py says how), and
the state at the end from the last segment with a check. Hooks relied on: the record layout of
ormas-monitor (diary events `alarm`, `certificate`, `repair` with `layer` and `count`; metrics
rows with `grad` and `stuck` per layer) and `RecordStore` (record/store.py).
"""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import Any

from ray_ormas._internal.record.fleet_record import action_text, alarm_when, preflight_text
from ray_ormas._internal.record.layout import DIARY, METRICS
from ray_ormas._internal.record.run_facts import RunFacts, run_facts
from ray_ormas._internal.record.store import RecordStore


def layer_table(store: RecordStore, segments: list[str]) -> list[dict[str, Any]]:
    """One dict per monitored layer over `segments` (oldest first): alarms, certified and repaired
    summed over them, stuck at end and status from the last one with a check."""
    alarms: Counter[str | None] = Counter()
    certified: Counter[str | None] = Counter()
    repaired: Counter[str | None] = Counter()
    last: dict[str, Any] = {}
    for segment in segments:
        rows = store.read_lines(posixpath.join(segment, METRICS))
        last = rows[-1] if rows else last
        for e in store.read_lines(posixpath.join(segment, DIARY)):
            layer = e.get("layer")
            if e.get("event") == "alarm":
                alarms[layer] += 1
            elif e.get("event") == "certificate":
                certified[layer] += int(e.get("count") or 0)
            elif e.get("event") == "repair":
                repaired[layer] += int(e.get("count") or 0)
    stuck = {layer: sum(v) for layer, v in (last.get("stuck") or {}).items()}
    layers = list(last.get("grad") or {})
    layers += [x for x in [*alarms, *certified, *repaired] if x is not None and x not in layers]
    table = []
    for layer in layers:
        status = (
            "repaired"
            if repaired[layer]
            else "certified dead"
            if certified[layer] and stuck.get(layer)
            else "stuck"
            if stuck.get(layer)
            else "alarms"
            if alarms[layer]
            else "healthy"
        )
        table.append(
            {
                "layer": layer,
                "alarms": alarms[layer],
                "certified": certified[layer],
                "repaired": repaired[layer],
                "stuck_at_end": stuck.get(layer, 0),
                "status": status,
            }
        )
    return table


def render(
    store: RecordStore, records: dict[str, str], mlflow: str | None, fleet: Any = None, run_page: str | None = None
) -> str:
    """The summary of a finished fit: a layer table per monitor, the fleet's per-rank table
    (a FleetSummary, when fleet health was on), then where everything is."""
    out = []
    for name, segment in records.items():
        run = run_facts(store, name)
        table = layer_table(store, store.segments(name) or [segment])
        healthy = sum(r["status"] == "healthy" for r in table)
        out.append(
            f"monitor {name!r}: {len(table)} layers, {healthy} healthy (the whole run: {run.attempts} "
            f"segment{'s' * (run.attempts != 1)}, {run.totals['checks']} checks, to run step {run.run_step})"
        )
        width = max([len("layer"), *(len(r["layer"]) for r in table)])
        out.append(f"  {'layer':<{width}}  alarms  certified  repaired  stuck at end  status")
        for r in table:
            out.append(
                f"  {r['layer']:<{width}}  {r['alarms']:>6}  {r['certified']:>9}  {r['repaired']:>8}  "
                f"{r['stuck_at_end']:>12}  {r['status']}"
            )
        out.append(f"  record: {store.shown(segment)}")
        out.append(f"  report: {store.shown(posixpath.join(segment, 'report.html'))}")
    if fleet is not None and not (fleet.ranks or fleet.alarms or fleet.resizes or fleet.checks):  # trained nothing
        out.append(
            f"fleet: nothing in this fit (no rank reached a check); the run's fleet records, one folder per "
            f"fit: {posixpath.dirname(fleet.record.rstrip('/'))}"
        )
    elif fleet is not None:
        out.append(f"fleet: {len(fleet.ranks)} ranks, {fleet.checks} checks, {len(fleet.alarms)} alarms")
        out.append(fleet.table())
        for a in fleet.resizes:  # an elastic fit's: events, not alarms
            out.append(
                f"  resized at run step {a.get('run_step')}: {a.get('resized_from')} -> {a.get('world_size')} ranks"
            )
        for screen in fleet.preflight:
            out.append(f"  pre-flight: {preflight_text(screen)}")
        for a in fleet.alarms:
            out.append(f"  alarm {alarm_when(a)}: {a.get('kind')}: {a.get('message')}")
        for x in fleet.actions:
            out.append(f"  action: {action_text(x)}")
        out.append(f"  fleet record: {fleet.record}")
    if run_page:
        out.append(f"run page: {run_page}")
    out.append(f"MLflow: {mlflow}" if mlflow else "MLflow: off")
    return "\n".join(out)


def whole_run_line(run: RunFacts) -> str:
    """`ray-ormas report`'s line of a monitor's whole run: counts over every segment, state at the end."""
    t = run.totals
    loss = f"{run.loss:.4g}" if run.loss is not None else "none"
    return (
        f"{run.monitor}: the whole run: {run.attempts} segment{'s' * (run.attempts != 1)} to run step "
        f"{run.run_step}: {t['checks']} checks, {t['alarms']} alarms, {t['certificates']} certificates, "
        f"{t['repairs']} repairs ({t['channels_repaired']} channels); at the end (its last check): "
        f"{run.stuck_channels if run.stuck_channels is not None else 'no'} stuck channels, loss {loss}"
    )
