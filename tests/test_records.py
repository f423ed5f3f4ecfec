"""Reading records back (Arrow tables, Parquet, rebuilt reports, `ray-ormas report/export`) from
records a real ormas-monitor `Monitor` wrote into claimed segments, on a local and a non-local
pyarrow filesystem. No Ray workers: the Ray-run records are read back in test_fault_tolerance.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from ormas_monitor import Monitor
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

from ray_ormas import RecordStorageError, open_records
from ray_ormas._internal.record.run_facts import run_facts, whole_run_counts
from ray_ormas._internal.record.segments import segment_link
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.seams.ormas import flush_metrics
from ray_ormas.demo import DigitsCNN, load_digits

pytestmark = pytest.mark.usefixtures("staging_in_tmp_path")  # segments staged by non-local stores


def _train(store: RecordStore, steps: int, close: bool, attempt: int) -> str:
    """A monitored run of `steps` steps in a newly claimed segment; unclosed = a crashed attempt."""
    torch.manual_seed(attempt)
    x, y, _, _ = load_digits(0)
    net = DigitsCNN()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    resumed = {"checkpoint": "ckpt-1", "record": {"model": {"run_steps": 20}}} if attempt else None
    link = segment_link(store, "model", run_name="r", fit_id="f", attempt=attempt, world_size=1, resumed_from=resumed)
    path, local = store.claim_segment("model", link)
    mon = Monitor(net, opt, out=local, check_every=5, verbose=False)
    for step in range(steps):
        loss = F.cross_entropy(net(x[step * 16 : (step + 1) * 16]), y[step * 16 : (step + 1) * 16])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    if close:
        mon.close()
    else:
        assert flush_metrics(mon)
        with open(local / "metrics.jsonl", "a") as f:
            f.write('{"step": 999, "lo')  # a row cut short by the crash
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=store.filesystem)
    return path


@pytest.fixture(params=["local", "subtree"])
def two_segments(request, tmp_path):
    if request.param == "local":
        store = RecordStore.at(tmp_path / "runs" / "r" / "ormas")
    else:
        (tmp_path / "bucket").mkdir()
        store = RecordStore(SubTreeFileSystem(str(tmp_path / "bucket"), LocalFileSystem()), "runs/r/ormas")
    crashed = _train(store, 22, close=False, attempt=0)
    _train(store, 15, close=True, attempt=1)
    return store, crashed


def test_segments_are_linked_and_tables_span_them(two_segments):
    store, crashed = two_segments
    records = open_records(store.root.removesuffix("/ormas"), store.filesystem)  # the run folder works too
    first, second = records.segments()
    assert (first.index, first.complete, second.index, second.complete) == (0, False, 1, True)
    assert first.link["previous"] is None
    prev = second.link["previous"]
    lines = [json.loads(x) for x in store.read_bytes(f"{crashed}/diary.jsonl").splitlines()]
    assert prev == {"segment": "segment-000", "last_hash": lines[-1]["hash"], "events": len(lines), "complete": False}
    assert second.link["step_offset"] == 20 and second.link["resumed_from"]["checkpoint"] == "ckpt-1"

    metrics = records.metrics()
    assert metrics.column("segment").to_pylist() == [0] * 5 + [1] * 3  # checks at 0,5,..,20 then 0,5,10
    assert metrics.column("step").to_pylist() == [0, 5, 10, 15, 20, 0, 5, 10]
    assert metrics.column("run_step").to_pylist() == [0, 5, 10, 15, 20, 20, 25, 30]
    assert all(isinstance(v, float) for v in metrics.column("loss").to_pylist())
    grads = dict(metrics.column("grad")[0].as_py())
    assert set(grads) >= {"conv1.0", "conv2.0", "conv3.0"}

    events = records.events()
    assert events.num_rows == first.events + second.events
    kinds = events.column("event").to_pylist()
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("run_end") == 1


def test_parquet_and_rebuilt_reports(two_segments, tmp_path):
    store, _ = two_segments
    records = open_records(store.root, store.filesystem)
    paths = records.write_parquet(tmp_path / "pq")
    assert pq.read_table(paths["metrics"]).equals(records.metrics())
    assert pq.read_table(paths["events"]).num_rows == records.events().num_rows
    done = records.rebuild_reports(tmp_path / "reports")
    assert [r.verified for r in done] == [True, True]  # the crashed one fails nothing but its run_end
    assert any("no run_end" in p for p in done[0].problems) and done[1].problems == []
    for r in done:
        assert r.reports["report"].is_file() and r.reports["report"].parent == r.local_dir


def test_report_and_export_commands(tmp_path):
    store = RecordStore.at(tmp_path / "runs" / "r" / "ormas")
    _train(store, 11, close=False, attempt=0)
    _train(store, 6, close=True, attempt=1)
    run = subprocess.run(
        [sys.executable, "-m", "ray_ormas", "report", str(tmp_path / "runs" / "r"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "model/segment-000  attempt 0" in run.stdout and "incomplete (no run_end" in run.stdout
    assert "model/segment-001  attempt 1" in run.stdout and run.stdout.count("verified") == 2
    # 11 steps checked at 0, 5, 10 (cut short: 3 checks, steps up to the last check) + 6 steps (0, 5)
    assert "model: the whole run: 2 segments to run step 26: 5 checks" in run.stdout, run.stdout
    assert (tmp_path / "out" / "model" / "segment-001" / "report.html").is_file()
    # The run's page, beside the rebuilt reports and in the record; the crashed segment is marked.
    assert f"run page: {tmp_path / 'out' / 'run.html'}" in run.stdout
    assert f"run page in the record: {tmp_path / 'runs' / 'r' / 'ormas' / 'run.html'}" in run.stdout
    page = (tmp_path / "out" / "run.html").read_text()
    assert page == (tmp_path / "runs" / "r" / "ormas" / "run.html").read_text()
    assert "data-segment='0' data-attempt='0' data-complete='false'" in page
    assert "data-segment='1' data-attempt='1' data-complete='true'" in page
    assert "attempt 0, 1 rank: incomplete" in page and "href='model/segment-001/report.html'" in page
    run = subprocess.run(
        [sys.executable, "-m", "ray_ormas", "export", f"file://{tmp_path}/runs/r", "--out", str(tmp_path / "pq")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert pq.read_table(tmp_path / "pq" / "metrics.parquet").num_rows == 3 + 2
    segments = pq.read_table(tmp_path / "pq" / "segments.parquet").to_pylist()
    assert [(r["attempt"], r["complete"], r["checks"]) for r in segments] == [(0, False, 3), (1, True, 2)]
    bad = subprocess.run(
        [sys.executable, "-m", "ray_ormas", "report", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no ray-ormas record under" in bad.stderr


def test_a_tampered_segment_fails_the_report(tmp_path):
    store = RecordStore.at(tmp_path / "ormas")
    path = _train(store, 6, close=True, attempt=0)
    diary = tmp_path / "ormas" / "model" / "segment-000" / "diary.jsonl"
    diary.write_text(diary.read_text().replace('"run_start"', '"run_start", "edited": 1', 1))
    done = open_records(tmp_path / "ormas").rebuild_reports(tmp_path / "out")
    assert not done[0].verified and any("hash chain" in p for p in done[0].problems), path
    with pytest.raises(RecordStorageError, match="no ray-ormas record"):
        open_records(tmp_path / "out" / "elsewhere")


def test_the_whole_run_sums_every_segment_and_ends_with_the_last_state(two_segments):
    store, crashed = two_segments
    facts = run_facts(store, "model")
    first, second = facts.segments
    rows = [json.loads(x) for x in (store.read_bytes(f"{crashed}/metrics.jsonl") or b"").decode().splitlines()[:-1]]
    assert (first.complete, first.counts["checks"], first.counts["steps"]) == (False, len(rows), rows[-1]["step"] + 1)
    later = store.segments("model")[1]
    end = [e for e in store.read_lines(f"{later}/diary.jsonl") if e["event"] == "run_end"][0]
    assert (second.complete, second.counts["checks"], second.counts["steps"]) == (True, end["checks"], end["steps"])
    assert second.counts["alarms"] == end["counts"]["alarms"] and second.step_offset == 20
    events = open_records(store.root, store.filesystem).events().to_pylist()
    for name, kind in (("alarms", "alarm"), ("certificates", "certificate"), ("repairs", "repair")):
        assert facts.totals[name] == sum(e["event"] == kind for e in events), name
    assert facts.totals["checks"] == len(rows) + end["checks"]
    assert facts.run_step == 20 + end["steps"]
    last = store.read_lines(f"{later}/metrics.jsonl")[-1]
    assert facts.loss == last["loss"] and facts.stuck_channels == sum(sum(v) for v in last["stuck"].values())
    counts = whole_run_counts(store)
    assert counts["ormas/segments"] == 2 and counts["ormas/checks"] == facts.totals["checks"]
    assert [r["segment"] for r in (first.row(), second.row())] == [0, 1]
