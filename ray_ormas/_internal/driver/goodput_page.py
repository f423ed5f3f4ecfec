"""run.html's goodput section: where each fit's time went, a bar per attempt on the time axis.

Called by driver/run_page.py with every fit's account (record/goodput.py). One lane per fit, its
x axis in seconds from the fit's `fit()` call; each attempt is a bar from where the one before
ended to its own end, cut into its buckets in the order the time passed (start-up or restart,
warm-up, productive, data wait, checkpoint, monitoring, lost progress, hang, wind-down, other),
each bucket's width its seconds. A restart is a red line where the next attempt's time began,
labelled with its cause. Then the buckets as a table, per fit and for the whole run.

Elements a reader (or a test) can find: `.goodput-attempt[data-fit][data-attempt]`,
`.goodput-bucket[data-bucket][data-seconds]`, `.restart-marker[data-cause]`.

Hooks relied on: none.
"""

from __future__ import annotations

import html
from typing import Any

from ray_ormas._internal.record.goodput import BUCKETS, GoodputAccount, combined, duration

ORDER = (  # the order a bar shows its buckets in: roughly the order the time passed
    "start_up",
    "restart",
    "warm_up",
    "productive",
    "data_wait",
    "checkpoint",
    "monitoring",
    "lost_progress",
    "hang",
    "wind_down",
    "other",
)
COLORS = {
    "productive": "#59a14f",
    "start_up": "#9c755f",
    "warm_up": "#edc948",
    "data_wait": "#4c78a8",
    "checkpoint": "#76b7b2",
    "restart": "#d62728",
    "lost_progress": "#ff9da7",
    "hang": "#8b1a1a",
    "monitoring": "#b07aa1",
    "wind_down": "#bab0ac",
    "other": "#dddddd",
}
LEFT, WIDTH = 120, 1080


def goodput_section(fits: list[GoodputAccount]) -> str:
    """The section (a note when no fit kept a timeline)."""
    if not fits:
        return (
            "<section id='goodput'><h2>Goodput</h2><p class='note'>No fit of this run kept a goodput "
            "timeline (trained by a ray-ormas older than the goodput account).</p></section>"
        )
    longest = max(a.wall_s for a in fits) or 1.0
    lane, bar = 44, 22
    parts: list[str] = []
    for n, account in enumerate(fits):
        y = 10 + n * lane
        parts.append(f"<text class='lane' x='{LEFT - 8}' y='{y + 15}' text-anchor='end'>fit {n + 1}</text>")
        for a in account.attempts:
            x0 = LEFT + (a.began - account.started) / longest * WIDTH
            cells = []
            x = x0
            for bucket in ORDER:
                seconds = a.buckets.get(bucket, 0.0)
                if seconds <= 0:
                    continue
                w = seconds / longest * WIDTH
                tip = f"attempt {a.attempt}: {bucket.replace('_', ' ')} {seconds:.1f} s"
                cells.append(
                    f"<rect class='goodput-bucket' data-bucket='{bucket}' data-seconds='{seconds:.3f}' "
                    f"x='{x:.1f}' y='{y}' width='{max(w, 0.5):.1f}' height='{bar}' fill='{COLORS[bucket]}'>"
                    f"<title>{_e(tip)}</title></rect>"
                )
                x += w
            share = f"{a.goodput:.0%}" if a.goodput is not None else "?"
            parts.append(
                f"<g class='goodput-attempt' data-fit='{n + 1}' data-attempt='{a.attempt}'>{''.join(cells)}"
                f"<text class='tick' x='{x0 + 2:.1f}' y='{y + bar + 11}'>attempt {a.attempt}: {share}</text></g>"
            )
        for r in account.restarts:
            nxt = next((a for a in account.attempts if a.attempt == r.attempt + 1), None)
            if nxt is None:
                continue
            x = LEFT + (nxt.began - account.started) / longest * WIDTH
            tip = f"restart after attempt {r.attempt}: {r.cause}, {r.restart_s:.1f} s; {r.lost_s:.1f} s redone"
            parts.append(
                f"<g class='restart-marker' data-cause='{_e(r.cause)}'><title>{_e(tip)}</title>"
                f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y - 4}' y2='{y + bar + 2}' stroke='#d62728' stroke-width='2'/>"
                f"<text class='tick' x='{x + 3:.1f}' y='{y - 1}'>{_e(r.cause)}</text></g>"
            )
    height = 10 + len(fits) * lane + 24
    axis = _axis(longest, height - 14)
    svg = f"<svg viewBox='0 0 {LEFT + WIDTH + 20} {height}' class='plot'>{''.join(parts)}{axis}</svg>"
    legend = " ".join(f"<span class='key' style='background:{COLORS[b]}'></span>{b.replace('_', ' ')}" for b in ORDER)
    run = combined(fits)
    lines = "".join(f"<p class='note'>fit {n + 1}: {_e(a.line())}</p>" for n, a in enumerate(fits))
    if run is not None and len(fits) > 1:
        lines += f"<p class='note'>the whole run: {_e(run.line())}</p>"
    return (
        "<section id='goodput'><h2>Goodput</h2><p class='note'>Where each fit's time went, from its "
        "<code>fit()</code> call to its return: one bar per attempt on the time axis, cut into its buckets "
        f"(docs/goodput.md); a red line marks a restart, with its cause. {legend}</p>{lines}{svg}"
        f"{_table(fits, run)}</section>"
    )


def _table(fits: list[GoodputAccount], run: GoodputAccount | None) -> str:
    columns: list[tuple[str, GoodputAccount]] = [(f"fit {n + 1}", a) for n, a in enumerate(fits)]
    if run is not None and len(fits) > 1:
        columns.append(("the run", run))
    head = "".join(f"<th>{_e(name)}</th>" for name, _ in columns)
    rows = [
        f"<tr><td>{b.replace('_', ' ')}</td>" + "".join(f"<td>{_seconds(a, b)}</td>" for _, a in columns) + "</tr>"
        for b in BUCKETS
    ]
    wall = "".join(f"<td>{duration(a.wall_s)}</td>" for _, a in columns)
    share = "".join(f"<td>{a.goodput:.1%}</td>" if a.goodput is not None else "<td>-</td>" for _, a in columns)
    return (
        f"<table class='goodput-table'><tr><th>bucket</th>{head}</tr>{''.join(rows)}"
        f"<tr><th>wall</th>{wall}</tr><tr><th>goodput</th>{share}</tr></table>"
    )


def _seconds(account: GoodputAccount, bucket: str) -> str:
    s = account.buckets[bucket]
    return f"{s:.1f} s ({s / account.wall_s:.0%})" if account.wall_s > 0 else "-"


def _axis(longest: float, y: int) -> str:
    step = next((s for s in (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200) if longest / s <= 10), 14400)
    ticks = []
    t = 0.0
    while t <= longest + 1e-9:
        x = LEFT + t / longest * WIDTH
        ticks.append(f"<text class='tick' x='{x:.1f}' y='{y + 10}' text-anchor='middle'>{duration(t)}</text>")
        t += step
    return f"<line class='axis' x1='{LEFT}' x2='{LEFT + WIDTH}' y1='{y}' y2='{y}'/>" + "".join(ticks)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)
