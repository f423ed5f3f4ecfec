"""One page per fit (driver/run_page.py): `run.html` in the run's record after every fit, an
artifact of its MLflow run, read in a real browser against the record.

The fit (`killed_and_repaired_fit`, tests/shared_fits.py) has what the page must show: two
attempts (rank 0 is killed in the first, so its segment is cut short; Ray resumes from the
last checkpoint it registered), a lesion that is certified and repaired, and a rank slowed in data
loading, so the fleet raises a straggler alarm in each attempt.
"""

from __future__ import annotations

from collections import Counter

import pytest
from mlflow import MlflowClient

from ray_ormas import open_records

from .browser import render


@pytest.mark.timeout(420)
def test_every_fit_writes_its_page_and_a_browser_shows_the_attempts_ranks_and_alarms_of_the_record(
    killed_and_repaired_fit, tmp_path
):
    result, storage = killed_and_repaired_fit.result, killed_and_repaired_fit.storage  # tests/shared_fits.py
    run = result.ormas
    page = storage / "paged" / "ormas" / "run.html"
    assert run.run_page == str(page) and page.is_file()
    artifacts = [a.path for a in MlflowClient(run.tracking_uri).list_artifacts(run.mlflow_run_id, "ormas")]
    assert "ormas/run.html" in artifacts

    text = page.read_text()
    assert "<script" not in text and "://" not in text  # self-contained: nothing runs, nothing is fetched
    shown = render(page, screenshot=tmp_path / "run.png")
    assert shown.console == [], shown.console  # no error, no warning, no message at all
    records = open_records(storage / "paged")

    # The attempts: one bar per segment, in the record's order, the crashed one marked.
    segments = records.segments()
    bars = [
        (a["data-monitor"], int(a["data-segment"]), a["data-attempt"], a["data-complete"])
        for a in shown.having("attempt")
    ]
    assert bars == [(s.monitor, s.index, str(s.attempt), str(s.complete).lower()) for s in segments]
    assert [b[3] for b in bars] == ["false", "true"]  # rank 0 was killed: its segment has no run_end
    # The resume is from epoch 1's checkpoint (run step 16), or epoch 0's (8) when Ray's controller
    # had not registered epoch 1's when rank 0 died 4 steps later (test_fault_tolerance.py allows both).
    assert [int(a["data-from"]) for a in shown.having("attempt")] == [s.step_offset for s in segments]
    assert segments[0].step_offset == 0 and segments[1].step_offset in (8, 16)
    assert "attempt 0, 2 ranks: incomplete" in shown.dom

    # The fleet's ranks, and a marker on every alarm's rank and check, in both pictures.
    checks = records.fleet_checks().to_pylist()
    assert [int(r["data-rank"]) for r in shown.having("fleet-rank")] == sorted({r["rank"] for r in checks}) == [0, 1]
    alarms = [a for a in records.fleet_alarms().to_pylist() if not a["kind"].endswith(("_recovered", "_resolved"))]
    assert alarms and {a["kind"] for a in alarms} == {"straggler"} and {a["attempt"] for a in alarms} == {0, 1}
    expected = Counter((a["kind"], r, a["check"], a["attempt"]) for a in alarms for r in a["ranks"])
    markers = Counter(
        (m["data-kind"], int(m["data-rank"]), int(m["data-check"]), int(m["data-attempt"]))
        for m in shown.having("alarm-marker")
    )
    assert markers == expected + expected  # the busy-time picture and the score picture

    # The whole run's facts, the layers' certificates and repairs, the loop's metrics.
    (facts,) = shown.having("monitor-facts")
    assert facts["data-monitor"] == "model"
    assert shown.dom.count("1 certificate") == 2 and shown.dom.count("1 repair") == 2  # conv2.0, conv3.0
    assert {c["data-metric"] for c in shown.having("chart")} >= {"epoch", "step", "loss (model)"}
    assert (tmp_path / "run.png").stat().st_size > 10_000

    # Where the time went: a bar per attempt on the time axis, cut into its buckets, the restart
    # marked with its cause (driver/goodput_page.py).
    assert [(g["data-fit"], g["data-attempt"]) for g in shown.having("goodput-attempt")] == [("1", "0"), ("1", "1")]
    seconds: Counter[str] = Counter()
    for cell in shown.having("goodput-bucket"):
        seconds[cell["data-bucket"]] += float(cell["data-seconds"])
    account = run.goodput
    assert account is not None
    # (the page is drawn at the wind-down, `result.ormas.goodput` closed as fit() returned: the same
    # buckets, wind-down longer)
    assert {b for b, s in seconds.items() if s > 0.05} == {b for b, s in account.buckets.items() if s > 0.05}
    assert [m["data-cause"] for m in shown.having("restart-marker")] == ["worker failure"]


def test_a_large_fleets_picture_stays_bounded_and_keeps_every_alarmed_rank():
    import pyarrow as pa

    from ray_ormas._internal.driver.run_page import MAX_COLUMNS, MAX_RANKS, _heatmap

    checks = pa.Table.from_pylist(
        [
            {"attempt": 0, "check": c, "rank": r, "data_s": 0.001, "forward_s": 0.002, "relative_score": 0.9}
            for c in range(2000)
            for r in range(200)
        ]
    )  # the fleet record's `checks` table, as run.html reads it
    alarms = [{"attempt": 0, "check": 1500, "kind": "straggler", "ranks": [197], "message": "rank 197 is slow"}]
    picture = _heatmap("busy", checks, alarms, "busy")
    assert picture.count("class='fleet-rank'") == MAX_RANKS and "data-rank='197'" in picture
    assert picture.count("<rect ") == MAX_RANKS * MAX_COLUMNS  # 2000 checks, 10 a column
    assert f"({MAX_RANKS} of 200 ranks: those with alarms, then the lowest scores) (10 checks a column" in picture
    assert picture.count("class='alarm-marker'") == 1 and len(picture) < 1_200_000


@pytest.mark.parametrize(
    "values, axis",
    [([1.4e-4, 0.02, 1.0], "log"), ([2.31, 2.30, 2.29], "linear"), ([-12345.6, 0.5], "linear"), ([0.0, 3.0], "linear")],
)
def test_a_charts_value_labels_are_whole_and_a_loss_over_decades_gets_a_log_axis(values, axis):
    import re

    from ray_ormas._internal.driver.run_page import TICK_CHAR_PX, _chart

    html = _chart("loss (model)", [(10 * i, v) for i, v in enumerate(values)], [], 10 * len(values))
    assert f"data-axis='{axis}'" in html and ("log axis" in html) == (axis == "log")
    labels = re.findall(r"<text class='tick' x='([\d.]+)' y='[\d.]+' text-anchor='end'>([^<]+)</text>", html)
    shown = {text for _, text in labels}
    assert {f"{max(values):.3g}", f"{min(values):.3g}"} <= shown, shown
    for x, text in labels:  # right-aligned at x: the whole label lies right of the figure's edge
        assert float(x) - TICK_CHAR_PX * len(text) >= 0, (x, text)
