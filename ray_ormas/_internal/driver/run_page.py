"""One page per fit: `run.html` in the run's record, built from the record alone.

Written on the driver at the end of every fit (driver/trainer.py, before the MLflow run is closed,
so the head node's last sync uploads it as the run's `ormas/run.html` artifact) and by `ray-ormas
report RUN`. It reads only what storage holds (the record, the fleet record, the MLflow journals),
so it can be rebuilt at any time, on any filesystem pyarrow reaches, for a run that crashed too.

The page is one self-contained file (inline CSS and SVG, no script, no network):

* the whole run's facts per monitor (record/run_facts.py: counts over every segment, and the state
  at the end, which is the last attempt's);
* the attempts on one run-step axis, one lane per monitor, a segment cut short by a crash hatched
  and marked incomplete, its alarms, certificates and repairs as marks on the lane;
* the loop's reported metrics (from the MLflow journals) and each monitor's loss over run steps,
  with the attempts' boundaries;
* each monitor's layers across segments: alarms, certificates, repairs, each segment linked to
  ormas-monitor's own report of it (`<monitor>/segment-NNN/report.html`, beside this page);
* where each fit's time went (driver/goodput_page.py): a bar per attempt on the time axis, cut
  into its goodput buckets, the restarts marked with their cause;
* fleet health per fit: a rank x check picture of busy time (data + forward) and of the straggler
  score, with every alarm marked on its rank and check.

Elements a reader (or a test) can find: `.attempt[data-monitor][data-attempt][data-complete]`,
`.fleet-rank[data-rank]`, `.alarm-marker[data-kind][data-rank][data-check]`, and the goodput
section's (driver/goodput_page.py).
"""

from __future__ import annotations

import html
import math
import os
import posixpath
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.driver.goodput_page import goodput_section
from ray_ormas._internal.record.fit_timeline import read_timelines
from ray_ormas._internal.record.fleet_record import (
    action_text,
    column,
    preflight_text,
    ranks_label,
    read_fleet_actions,
    read_fleet_alarms,
    read_fleet_attempts,
    read_fleet_meta,
    read_fleet_preflight,
    read_fleet_summaries,
    read_fleet_table,
)
from ray_ormas._internal.record.fleet_tables import CHECKS_TABLE
from ray_ormas._internal.record.goodput import account_of
from ray_ormas._internal.record.layout import REPORT, RUN_PAGE
from ray_ormas._internal.record.reader import RunRecords, Segment
from ray_ormas._internal.record.run_facts import COUNTS, RunFacts, run_facts
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.journal import TrackingJournal
from ray_ormas._internal.tracking.sync import read_journals
from ray_ormas.errors import JournalError, RecordStorageError

logger = get_logger("ray_ormas.run_page")

WIDTH = 1080  # the plots' drawing width, in SVG units
LEFT = 120  # room for lane and axis labels
PALETTE = ("#4c78a8", "#59a14f", "#9c755f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#bab0ac")
MARKS = {"alarm": "#d62728", "certificate": "#f28e2b", "repair": "#2ca02c"}
RECOVERIES = ("straggler_recovered", "divergence_resolved")
INCOMPLETE = "<br><span class='bad'>incomplete</span>"
MAX_COLUMNS = 200  # a fleet picture's columns: a longer run's checks share them (at most about 1 MB a picture)
MAX_RANKS = 48  # a fleet picture's rows


def write_run_page(records: RunRecords, title: str | None = None, to: str | os.PathLike | None = None) -> str:
    """Build the page from the record and write it as `run.html` at the record's root (or in the
    local folder `to`, which holds copies of the segments as `<monitor>/segment-NNN/`); return
    where it is."""
    page = build_run_page(records, title).encode()
    if to is not None:
        path = Path(to) / RUN_PAGE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(page)
        return str(path)
    where = posixpath.join(records.store.root, RUN_PAGE)
    records.store.write_bytes(where, page)
    return records.store.shown(where)


def build_run_page(records: RunRecords, title: str | None = None) -> str:
    store = records.store
    monitors = records.monitors()
    facts = {m: run_facts(store, m) for m in monitors}
    segments = records.segments()
    events = [e for e in records.events().to_pylist() if e["event"] in MARKS]
    rows = records.metrics().to_pylist()
    journals = _journals(store)
    fleets = [_fleet(store, fit_id) for fit_id in records.fleets()]
    end = max([f.run_step for f in facts.values()] + [1])
    name = title or next((s.link.get("run_name") for s in segments if s.link.get("run_name")), None) or "run"
    body = [
        f"<header><h1>{_e(name)}</h1><p class='summary'>{_e(_summary(facts, fleets))}</p>"
        f"<p class='where'>record: {_e(store.shown())}</p></header>",
        _facts_section(facts),
        _attempts_section(facts, segments, events, end),
        _goodput(records),
        _metrics_section(journals, rows, segments, end),
        _layers_section(monitors, segments, events, store.root),
        _fleet_section(
            fleets,
            {fit_id: read_fleet_attempts(store, fit_id) for fit_id, *_ in fleets},
            {fit_id: read_fleet_actions(store, fit_id) for fit_id, *_ in fleets},
            {fit_id: len(read_fleet_summaries(store, fit_id)) for fit_id, *_ in fleets},
            {fit_id: read_fleet_preflight(store, fit_id) for fit_id, *_ in fleets},
        ),
    ]
    return PAGE.format(title=_e(f"{name}: ray-ormas run"), css=CSS, body="\n".join(body))


def _goodput(records: RunRecords) -> str:
    """The goodput section (driver/goodput_page.py); a note when the timelines cannot be read."""
    try:  # as of each fit's wind-down, as MLflow has it: the page is the same whenever it is rebuilt
        return goodput_section([account_of(replace(t, returned=None)) for t in read_timelines(records.store)])
    except RecordStorageError as e:
        logger.warning("run.html: %s; the page shows no goodput", e)
        return (
            "<section id='goodput'><h2>Goodput</h2><p class='note'>The fits' timelines could not be read.</p></section>"
        )


def _journals(store: RecordStore) -> list[TrackingJournal]:
    """The run's MLflow journals; none (said once) when one cannot be read: the page is drawn
    without the loop's metrics rather than not at all."""
    try:
        return read_journals(store)
    except JournalError as e:
        logger.warning("run.html: %s; the page shows no loop metrics", e)
        return []


# ------------------------------------------------------------------ the whole run's facts
def _summary(facts: dict[str, RunFacts], fleets: list[Any]) -> str:
    """One line: attempts, steps, and what happened."""
    out = []
    for monitor, f in facts.items():
        t = f.totals
        out.append(
            f"{monitor}: {f.attempts} attempt{'s' if f.attempts != 1 else ''} to run step {f.run_step}, "
            f"{t.get('alarms', 0)} alarms, {t.get('certificates', 0)} certificates, {t.get('repairs', 0)} repairs "
            f"({t.get('channels_repaired', 0)} channels)"
        )
    alarms = sum(1 for _, _, _, a in fleets for x in a if x.get("kind") not in RECOVERIES)
    if fleets:
        out.append(f"fleet: {alarms} alarm{'s' if alarms != 1 else ''}")
    return " · ".join(out)


def _facts_section(facts: dict[str, RunFacts]) -> str:
    head = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in ("attempts", *COUNTS))
    lines = []
    for monitor, f in facts.items():
        counts = "".join(f"<td>{f.totals.get(c, 0)}</td>" for c in COUNTS)
        incomplete = sum(not s.complete for s in f.segments)
        cut = f" <span class='bad'>({incomplete} cut short)</span>" if incomplete else ""
        end = (
            f"stuck channels {_n(f.stuck_channels)} in {_n(f.stuck_layers)} layers, loss {_num(f.loss)}"
            if f.loss is not None or f.stuck_channels is not None
            else "no check yet"
        )
        lines.append(
            f"<tr class='monitor-facts' data-monitor='{_e(monitor)}'><th>{_e(monitor)}</th>"
            f"<td>{f.attempts}{cut}</td>{counts}<td>{_e(end)}</td></tr>"
        )
    return (
        "<section id='facts'><h2>The whole run</h2>"
        "<p class='note'>Counts over every attempt (a repair an attempt redid counts again); the state at "
        "the end is the last attempt's.</p>"
        f"<table><tr><th>monitor</th>{head}<th>at the end (last attempt)</th></tr>{''.join(lines)}</table></section>"
    )


# ------------------------------------------------------------------ the attempts on one axis
def _attempts_section(
    facts: dict[str, RunFacts], segments: list[Segment], events: list[dict[str, Any]], end: int
) -> str:
    steps = {(sf.monitor, sf.segment): sf.counts.get("steps", 0) for f in facts.values() for sf in f.segments}
    spans = {
        (s.monitor, s.index): (s.step_offset, s.step_offset + steps.get((s.monitor, s.index), 0)) for s in segments
    }
    bar, top, y = 22, 18, 18
    parts: list[str] = []
    for monitor in facts:
        own = [s for s in segments if s.monitor == monitor]
        rows = _rows([spans[(s.monitor, s.index)] for s in own])  # an attempt that redid steps: a row below
        parts.append(
            f"<text class='lane' x='{LEFT - 8}' y='{y + 10 + bar / 2 + 4:.0f}' text-anchor='end'>{_e(monitor)}</text>"
        )
        for e in (e for e in events if e["monitor"] == monitor and e["run_step"] is not None):
            tip = f"{e['event']} at run step {e['run_step']}" + (f", layer {e['layer']}" if e["layer"] else "")
            parts.append(
                f"<circle class='mark mark-{e['event']}' cx='{_x(e['run_step'], end):.1f}' cy='{y + 3}' r='3.5' "
                f"fill='{MARKS[e['event']]}'><title>{_e(tip)}</title></circle>"
            )
        for seg, row in zip(own, rows):
            a, b = spans[(seg.monitor, seg.index)]
            x0, x1 = _x(a, end), max(_x(b, end), _x(a, end) + 3)
            top_y = y + 10 + row * (bar + 4)
            color = PALETTE[(seg.attempt or 0) % len(PALETTE)]
            world = seg.link.get("world_size")
            label = f"attempt {_n(seg.attempt)}" + (f", {world} rank{'s' * (world != 1)}" if world else "")
            label += "" if seg.complete else ": incomplete"
            tip = (
                f"{seg.monitor} segment-{seg.index:03d}, attempt {_n(seg.attempt)} of fit {seg.link.get('fit_id')}: "
                f"run steps {a} to {b}" + ("" if seg.complete else " (cut short: no run_end)")
            )
            stroke = "" if seg.complete else "stroke-dasharray='4,2' stroke-width='2'"
            parts.append(
                f"<g class='attempt' data-monitor='{_e(monitor)}' data-segment='{seg.index}' "
                f"data-attempt='{_n(seg.attempt)}' data-complete='{str(seg.complete).lower()}' "
                f"data-from='{a}' data-to='{b}'><title>{_e(tip)}</title>"
                f"<rect x='{x0:.1f}' y='{top_y}' width='{x1 - x0:.1f}' height='{bar}' rx='3' "
                f"fill='{color if seg.complete else 'url(#cut)'}' stroke='{color}' {stroke}/>"
                f"<text class='{'bar' if seg.complete else 'bar cut'}' x='{x0 + 5:.1f}' y='{top_y + 15}'>"
                f"{_e(label)}</text></g>"
            )
        y += 10 + (max(rows, default=0) + 1) * (bar + 4) + 12
    height = y + 26
    svg = (
        f"<svg viewBox='0 0 {LEFT + WIDTH + 20} {height}' class='plot'>"
        "<defs><pattern id='cut' width='6' height='6' patternUnits='userSpaceOnUse' patternTransform='rotate(45)'>"
        "<rect width='6' height='6' fill='#f7e1e1'/><line x1='0' y1='0' x2='0' y2='6' stroke='#e8a0a0' "
        f"stroke-width='2'/></pattern></defs>{_axis(end, y + 2, top - 8, y + 2)}{''.join(parts)}</svg>"
    )
    legend = " ".join(f"<span class='key' style='background:{c}'></span>{k}s" for k, c in MARKS.items())
    return (
        "<section id='attempts'><h2>Attempts</h2><p class='note'>One bar per segment (one attempt of one fit) "
        "on the run's step axis; an attempt that resumed from an earlier checkpoint redoes steps, and its bar "
        f"sits below the one it overlaps. Marks above: {legend}. Hatched: cut short by a crash.</p>{svg}</section>"
    )


def _rows(spans: list[tuple[int, int]]) -> list[int]:
    """A row per span, each the first whose spans so far end at or before it starts."""
    ends: list[int] = []
    rows = []
    for a, b in spans:
        row = next((i for i, e in enumerate(ends) if e <= a), len(ends))
        if row == len(ends):
            ends.append(b)
        else:
            ends[row] = b
        rows.append(row)
    return rows


# ------------------------------------------------------------------ the loop's metrics and the loss
def _metrics_section(
    journals: list[TrackingJournal], rows: list[dict[str, Any]], segments: list[Segment], end: int
) -> str:
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for journal in journals:
        for report in journal.reports:
            for key, value in report.metrics.items():
                if not key.startswith("ormas/"):
                    series[key].append((report.step, value))
    for row in rows:
        if isinstance(row["loss"], float) and row["run_step"] is not None:
            series[f"loss ({row['monitor']})"].append((row["run_step"], row["loss"]))
    if not series:
        return (
            "<section id='metrics'><h2>Metrics</h2><p class='note'>No metric to show: the loop's reported "
            "metrics are kept in the MLflow journal (this run trained without MLflow), and no monitor "
            "recorded a loss.</p></section>"
        )
    bounds = sorted({s.step_offset for s in segments if s.step_offset > 0})
    charts = "".join(_chart(name, sorted(points), bounds, end) for name, points in series.items())
    return (
        "<section id='metrics'><h2>Metrics</h2><p class='note'>The loop's reported metrics (from the MLflow "
        "journal) and each monitor's loss at its checks, on the run's step axis; dashed: where an attempt "
        f"began.</p><div class='charts'>{charts}</div></section>"
    )


TICK_CHAR_PX = 6.2  # the width of a character of a tick label (.tick: 10px system-ui), a little over


def _chart(name: str, points: list[tuple[int, float]], bounds: list[int], end: int) -> str:
    """One metric on the run's step axis. The left margin fits the value labels whole, and a
    positive series spanning two decades or more gets a log axis (the caption says so)."""
    width, height, bottom = 520, 150, 34
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    lo, hi = (min(v for _, v in finite), max(v for _, v in finite)) if finite else (0.0, 1.0)
    log = lo > 0 and hi / lo >= 100
    hi = hi if hi > lo else lo + 1.0
    top_label, bottom_label = f"{hi:.3g}", f"{lo:.3g}"
    pad = max(bottom, 10 + math.ceil(TICK_CHAR_PX * max(len(top_label), len(bottom_label))))

    def fraction_below_top(value: float) -> float:
        if log:
            return (math.log10(hi) - math.log10(value)) / (math.log10(hi) - math.log10(lo))
        return (hi - value) / (hi - lo)

    def xy(step: int, value: float) -> tuple[float, float]:
        return pad + step / max(end, 1) * (width - pad - 8), 10 + fraction_below_top(value) * (height - bottom - 10)

    parts = [
        f"<line class='bound' x1='{xy(b, lo)[0]:.1f}' x2='{xy(b, lo)[0]:.1f}' y1='6' y2='{height - bottom}'/>"
        for b in bounds
    ]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, v) for s, v in finite))
    parts.append(f"<polyline points='{line}' fill='none' stroke='#4c78a8' stroke-width='1.6'/>")
    for s, v in finite if len(finite) <= 60 else []:
        x, y = xy(s, v)
        parts.append(
            f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.2' fill='#4c78a8'><title>step {s}: {v:.4g}</title></circle>"
        )
    for s, v in points:
        if not math.isfinite(v):
            x = xy(s, lo)[0]
            parts.append(f"<text class='nonfinite' x='{x:.1f}' y='18'>{_e(str(v))}<title>step {s}: {v}</title></text>")
    parts.append(
        f"<text class='tick' x='{pad - 4}' y='14' text-anchor='end'>{top_label}</text>"
        f"<text class='tick' x='{pad - 4}' y='{height - bottom}' text-anchor='end'>{bottom_label}</text>"
        f"<text class='tick' x='{pad}' y='{height - bottom + 14}'>0</text>"
        f"<text class='tick' x='{width - 8}' y='{height - bottom + 14}' text-anchor='end'>{end}</text>"
    )
    caption = _e(name) + (" <span class='scale'>log axis</span>" if log else "")
    return (
        f"<figure class='chart' data-metric='{_e(name)}' data-axis='{'log' if log else 'linear'}'>"
        f"<figcaption>{caption}</figcaption>"
        f"<svg viewBox='0 0 {width} {height - bottom + 20}'>{''.join(parts)}</svg></figure>"
    )


# ------------------------------------------------------------------ each monitor's layers across segments
def _layers_section(monitors: list[str], segments: list[Segment], events: list[dict[str, Any]], root: str) -> str:
    tables = []
    for monitor in monitors:
        own = [s for s in segments if s.monitor == monitor]
        counts: dict[str, dict[int, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for e in events:
            if e["monitor"] == monitor and e["layer"]:
                counts[e["layer"]][e["segment"]][e["event"]] += 1
        head = "".join(
            f"<th><a href='{_e(_report_link(s, root))}'>segment-{s.index:03d}</a><br>attempt {_n(s.attempt)}"
            f"{'' if s.complete else INCOMPLETE}</th>"
            for s in own
        )
        body = []
        for layer in counts:
            cells = "".join(f"<td>{_badges(counts[layer].get(s.index, Counter()))}</td>" for s in own)
            body.append(f"<tr><th class='layer'>{_e(layer)}</th>{cells}</tr>")
        if not body:
            body.append(f"<tr><td colspan='{len(own) + 1}' class='note'>no alarm, certificate or repair</td></tr>")
        tables.append(
            f"<h3>{_e(monitor)}</h3><table class='layers'><tr><th>layer</th>{head}</tr>{''.join(body)}</table>"
        )
    return (
        "<section id='layers'><h2>Layers</h2><p class='note'>Alarms, certificates (a layer proved dead) and "
        "repairs per layer and segment; each segment's header links to ormas-monitor's own report of it.</p>"
        f"{''.join(tables)}</section>"
    )


def _report_link(seg: Segment, root: str) -> str:
    return posixpath.relpath(posixpath.join(seg.path, REPORT), root)


def _badges(counts: Counter[str]) -> str:
    return " ".join(
        f"<span class='badge {kind}'>{counts[kind]} {kind}{'s' if counts[kind] > 1 else ''}</span>"
        for kind in MARKS
        if counts.get(kind)
    )


# ------------------------------------------------------------------ fleet health
def _fleet(store: RecordStore, fit_id: str) -> tuple[str, dict[str, Any], pa.Table, list[dict[str, Any]]]:
    """One fit's fleet record: (fit id, fleet.json, the `checks` table, the alarm lines)."""
    meta = read_fleet_meta(store, fit_id)
    return fit_id, meta, read_fleet_table(store, fit_id, CHECKS_TABLE, meta), read_fleet_alarms(store, fit_id)


def _fleet_section(
    fleets: list[tuple[str, dict[str, Any], pa.Table, list[dict[str, Any]]]],
    fleet_attempts: dict[str, list[dict[str, Any]]],
    fleet_actions: dict[str, list[dict[str, Any]]],
    fleet_checks: dict[str, int],
    fleet_preflight: dict[str, list[dict[str, Any]]],
) -> str:
    if not fleets:
        return (
            "<section id='fleet'><h2>Fleet health</h2>"
            "<p class='note'>Fleet health was off (or one worker).</p></section>"
        )
    out = []
    for fit_id, meta, checks, alarms in fleets:
        marks = [a for a in alarms if a.get("kind") not in RECOVERIES]
        listed = "".join(
            f"<li><b>{_e(str(a.get('kind')))}</b> {_when(a)}: {_e(str(a.get('message')))}</li>" for a in alarms
        )
        screened = "".join(
            f"<li class='preflight' data-clean='{str(bool(x.get('clean'))).lower()}'>{_e(preflight_text(x))}</li>"
            for x in fleet_preflight.get(fit_id, [])
        )
        resizes = "".join(
            f"<li class='resize'>resized at run step {_n(a.get('run_step'))}: {_n(a.get('resized_from'))} to "
            f"{_n(a.get('world_size'))} ranks (attempt {_n(a.get('attempt'))})</li>"
            for a in fleet_attempts.get(fit_id, [])
            if a.get("event") == "resize"
        )
        acted = "".join(
            f"<li class='action' data-alarm='{_e(str(x.get('alarm')))}' data-action='{_e(str(x.get('action')))}'>"
            f"{_e(action_text(x))}</li>"
            for x in fleet_actions.get(fit_id, [])
        )
        out.append(
            f"<h3>fit {_e(fit_id)}: {_e(ranks_label(meta))}, "
            f"{fleet_checks.get(fit_id, 0)} checks, {len(marks)} alarms</h3>"
            + _heatmap("busy time (data + forward), ms", checks, marks, "busy")
            + _heatmap("straggler score (1 = as fast as the others)", checks, marks, "score")
            + (f"<ul class='preflight'>{screened}</ul>" if screened else "")
            + (f"<ul class='resizes'>{resizes}</ul>" if resizes else "")
            + (f"<ul class='alarms'>{listed}</ul>" if listed else "<p class='note'>No alarm.</p>")
            + (f"<ul class='actions'>{acted}</ul>" if acted else "")
        )
    return (
        "<section id='fleet'><h2>Fleet health</h2><p class='note'>One row per rank, one column per check "
        "(every attempt, in order); a ringed cell is an alarm on that rank at that check.</p>"
        f"{''.join(out)}</section>"
    )


def _when(alarm: dict[str, Any]) -> str:
    """An alarm's place: at its run step, or before the first step (the pre-flight screen's)."""
    if alarm.get("kind") == "preflight" and alarm.get("run_step") is None:
        return "before the first step"
    return f"at run step {_n(alarm.get('run_step'))}"


def _cell_values(checks: pa.Table, kind: str) -> np.ndarray:
    """Each row's value: busy time in ms (data + forward), or its straggler score; NaN when none."""
    if kind == "score":
        return column(checks, "relative_score")
    data, forward = column(checks, "data_s"), column(checks, "forward_s")
    busy = (np.nan_to_num(data) + np.nan_to_num(forward)) * 1000.0
    return np.where(np.isnan(data) & np.isnan(forward), np.nan, busy)


def _heatmap(title: str, checks: pa.Table, alarms: list[dict[str, Any]], kind: str) -> str:
    """Ranks x checks, coloured by busy time or score (`kind`). A long run's checks share columns
    (at most MAX_COLUMNS; a column shows its worst value) and a large fleet shows MAX_RANKS ranks:
    those with alarms, then the lowest scores. Column arithmetic (numpy): a week of rows at 64
    ranks is millions of them."""
    attempts, numbers = column(checks, "attempt", 0).astype(np.int64), column(checks, "check", 0).astype(np.int64)
    rank_of = column(checks, "rank", -1).astype(np.int64)
    span = int(np.max(numbers)) + 1 if numbers.size else 1
    keys, place = np.unique(attempts * span + numbers, return_inverse=True)
    columns = [(int(k // span), int(k % span)) for k in keys]
    per = max(1, math.ceil(len(columns) / MAX_COLUMNS))
    col: dict[Any, int] = {key: i // per for i, key in enumerate(columns)}
    ranks = _shown_ranks(checks, alarms)
    row = {r: i for i, r in enumerate(ranks)}
    width = col[columns[-1]] + 1 if columns else 0
    cell, row_h, top = max(3.0, min(26.0, WIDTH / max(width, 1))), 20, 16
    # The colour scale leaves out each attempt's first check (warm-up: not scored) and tops out at the
    # 95th percentile, so one long check does not wash out the rest.
    value = _cell_values(checks, kind)
    values = np.sort(value[(numbers > 0) & np.isfinite(value)])
    lo, hi = (
        (float(values[0]), float(values[min(len(values) - 1, int(0.95 * len(values)))])) if values.size else (0.0, 1.0)
    )
    grid = np.full((len(ranks), max(width, 1)), -np.inf if kind == "busy" else np.inf)
    shown = np.isin(rank_of, ranks) & np.isfinite(value)
    lane = np.searchsorted(np.asarray(ranks, dtype=np.int64), rank_of[shown])
    (np.maximum if kind == "busy" else np.minimum).at(grid, (lane, place[shown] // per), value[shown])
    parts = [
        f"<text class='lane' x='{LEFT - 8}' y='{top + row[r] * row_h + 14}' text-anchor='end'>rank {r}</text>"
        for r in ranks
    ]
    for attempt in sorted({a for a, _ in columns}):
        x = LEFT + min(i for (a, _), i in col.items() if a == attempt) * cell
        parts.append(f"<text class='tick' x='{x + 2:.1f}' y='{top - 4}'>attempt {attempt}</text>")
        if x > LEFT:
            parts.append(f"<line class='sep' x1='{x:.1f}' x2='{x:.1f}' y1='2' y2='{top + row_h * len(ranks)}'/>")
    for r in ranks:
        for i in range(width):
            got = float(grid[row[r], i])
            v = got if math.isfinite(got) else None
            what = f"checks {i * per}-{i * per + per - 1}" if per > 1 else f"check column {i}"
            tip = f"rank {r}, {what}: {_num(v)}"
            parts.append(
                f"<rect x='{LEFT + i * cell + 0.5:.1f}' y='{top + row[r] * row_h + 1}' width='{max(cell - 1, 1):.1f}' "
                f"height='{row_h - 2}' fill='{_color(v, lo, hi, kind)}'><title>{_e(tip)}</title></rect>"
            )
    for a in alarms:
        key = (a.get("attempt"), a.get("check"))
        for r in (r for r in a.get("ranks") or [] if key in col and r in row):
            cx, cy = LEFT + col[key] * cell + cell / 2, top + row[r] * row_h + row_h / 2
            parts.append(
                f"<circle class='alarm-marker' data-kind='{_e(str(a.get('kind')))}' data-rank='{r}' "
                f"data-check='{a.get('check')}' data-attempt='{a.get('attempt')}' cx='{cx:.1f}' cy='{cy:.1f}' "
                f"r='{row_h / 2 - 1:.0f}' fill='none' stroke='#111' stroke-width='2.5'>"
                f"<title>{_e(str(a.get('message')))}</title></circle>"
            )
    every = len(np.unique(rank_of))
    note = f" ({len(ranks)} of {every} ranks: those with alarms, then the lowest scores)" if len(ranks) < every else ""
    note += f" ({per} checks a column, its worst value)" if per > 1 else ""
    rows = "".join(f"<span class='fleet-rank' data-rank='{r}'></span>" for r in ranks) if kind == "busy" else ""
    height, span_px = top + row_h * len(ranks) + 4, LEFT + width * cell + 10
    scale = f"<span class='scale'>{_num(lo)} <span class='ramp {kind}'></span> {_num(hi)}</span>"
    return (
        f"<figure class='heatmap' data-kind='{kind}'><figcaption>{_e(title + note)} {scale}</figcaption>{rows}"
        f"<svg viewBox='0 0 {span_px:.0f} {height}' style='max-width:{span_px:.0f}px'>"
        f"{''.join(parts)}</svg></figure>"
    )


def _shown_ranks(checks: pa.Table, alarms: list[dict[str, Any]]) -> list[int]:
    """Every rank, or MAX_RANKS of them: the alarms' ranks first, then the lowest scores."""
    rank_of = column(checks, "rank", -1).astype(np.int64)
    score = np.nan_to_num(column(checks, "relative_score"), nan=1.0)
    every = np.unique(rank_of)
    lowest_of = np.ones(len(every))
    np.minimum.at(lowest_of, np.searchsorted(every, rank_of), score)
    lowest = {int(r): float(v) for r, v in zip(every, lowest_of)}
    if len(lowest) <= MAX_RANKS:
        return sorted(lowest)
    named = {r for a in alarms for r in a.get("ranks") or [] if r in lowest}
    order = sorted(lowest, key=lambda r: (r not in named, lowest[r], r))
    return sorted(order[:MAX_RANKS])


def _color(v: Any, lo: float, hi: float, kind: str) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "#e6e6e6"
    t = 0.0 if hi <= lo else min(1.0, (v - lo) / (hi - lo))
    if kind == "score":  # low score red, 1 green
        t = max(0.0, min(1.0, v))
        r, g, b = int(214 + (89 - 214) * t), int(39 + (161 - 39) * t), int(40 + (79 - 40) * t)
    else:  # longer busy time darker blue
        r, g, b = int(237 + (33 - 237) * t), int(243 + (102 - 243) * t), int(250 + (172 - 250) * t)
    return f"rgb({r},{g},{b})"


# ------------------------------------------------------------------ small pieces
def _axis(end: int, y: int, top: int, bottom: int) -> str:
    ticks = _ticks(end)
    out = [f"<line class='axis' x1='{LEFT}' x2='{LEFT + WIDTH}' y1='{y}' y2='{y}'/>"]
    for t in ticks:
        x = _x(t, end)
        out.append(
            f"<line class='grid' x1='{x:.1f}' x2='{x:.1f}' y1='{top}' y2='{bottom}'/>"
            f"<text class='tick' x='{x:.1f}' y='{y + 16}' text-anchor='middle'>{t}</text>"
        )
    out.append(f"<text class='tick' x='{LEFT - 8}' y='{y + 16}' text-anchor='end'>run step</text>")
    return "".join(out)


def _ticks(end: int) -> list[int]:
    raw = max(end / 8, 1)
    step = 10 ** math.floor(math.log10(raw))
    step = next(m * step for m in (1, 2, 5, 10) if m * step >= raw)
    return list(range(0, end + 1, int(step)))


def _x(step: int, end: int) -> float:
    return LEFT + step / max(end, 1) * WIDTH


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _n(value: Any) -> str:
    return "?" if value is None else str(value)


def _num(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.4g}"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0;background:#f6f7f9}
header{background:#1f2d3d;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
.where{margin:4px 0 0;color:#b8c4d0;font-size:12px;word-break:break-all}
section{background:#fff;margin:16px 24px;padding:14px 20px;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08)}
h2{font-size:17px;margin:0 0 6px}h3{font-size:14px;margin:14px 0 6px}
.note{color:#666;font-size:12.5px;margin:0 0 10px}
table{border-collapse:collapse;font-size:12.5px}th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:left}
td{font-variant-numeric:tabular-nums}.bad{color:#c0392b;font-weight:600}
svg{display:block;width:100%;height:auto}.plot{max-width:1220px}
text{font:11px system-ui,sans-serif;fill:#333}.bar{fill:#fff;font-weight:600}.lane{font-weight:600}
.tick{fill:#777;font-size:10px}.axis{stroke:#999}.grid{stroke:#eee}.bound{stroke:#999;stroke-dasharray:3,3}
.nonfinite{fill:#d62728;font-weight:700}.cut{fill:#8b1a1a}.sep{stroke:#333;stroke-width:1.5}
.summary{margin:6px 0 0;color:#dfe6ee}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{margin:0;width:520px}
.chart figcaption{font-weight:600;font-size:12.5px}
.heatmap{margin:6px 0 12px}.heatmap figcaption{font-size:12.5px;margin-bottom:2px}
.scale{color:#777;margin-left:10px;font-size:11px}.ramp{display:inline-block;width:60px;height:8px;vertical-align:middle}
.ramp.busy{background:linear-gradient(90deg,rgb(237,243,250),rgb(33,102,172))}
.ramp.score{background:linear-gradient(90deg,rgb(214,39,40),rgb(89,161,79))}
.badge{display:inline-block;border-radius:9px;padding:0 7px;font-size:11.5px;color:#fff;margin:1px}
.badge.alarm{background:#d62728}.badge.certificate{background:#f28e2b}.badge.repair{background:#2ca02c}
.key{display:inline-block;width:9px;height:9px;border-radius:5px;margin:0 3px 0 8px}
.alarms{font-size:12.5px;margin:4px 0}th.layer{font-family:ui-monospace,monospace;font-weight:500}
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title><style>{css}</style></head>
<body>
{body}
<footer class="note" style="margin:0 24px 24px">Written by ray-ormas from the run's record; rebuild it with
<code>ray-ormas report RUN</code>.</footer>
</body></html>
"""
