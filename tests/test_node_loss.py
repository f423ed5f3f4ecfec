"""Losing the node that hosts the workers (rank 0 included) mid-run: the run completes on a fresh
node from its last checkpoint, and the record in storage is complete and linked. The scenarios
run one after the other on one simulated multi-node cluster in a subprocess
(tests/scenarios/node_loss.py): with local storage, with S3, and without a replacement node. The
session's Ray cluster is untouched; the subprocess's process group is killed if it hangs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pyarrow.compute as pc
import pytest
from ormas_monitor.record import verify_run

from ray_ormas import open_records

from .conftest import ROOT, temporary_folders

pytestmark = pytest.mark.system  # its own Ray head or cluster


FITS = {"local": "replace", "s3": "replace", "bounded": "no-replacement"}  # in this order: the last leaves no node


@pytest.fixture(scope="module")
def lost_nodes(tmp_path_factory, s3) -> Iterator[tuple[Path, dict[str, str], str]]:
    """The three fits of the scenario: the folder of their outcomes, each fit's storage, the log.
    What the lost node staged on this machine (its S3 segment's local copy) is removed after."""
    base = tmp_path_factory.mktemp("node-loss")
    storage = {"local": str(base / "local"), "s3": f"{s3.bucket()}/runs", "bounded": str(base / "bounded")}
    before = temporary_folders()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    fits = [f"{name}={mode}@{storage[name]}" for name, mode in FITS.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.scenarios.node_loss", str(base), *fits],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"the node-loss scenario hung:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-4000:]
    yield base, storage, log
    for name in set(temporary_folders()) - set(before):
        shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


def outcome_of(lost_nodes: tuple[Path, dict[str, str], str], name: str) -> tuple[dict, str, str]:
    base, storage, log = lost_nodes
    assert (base / f"{name}.json").is_file(), log[-4000:]
    return json.loads((base / f"{name}.json").read_text()), storage[name], log


@pytest.mark.timeout(1000)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_losing_the_workers_node_mid_run_ends_in_a_completed_run_and_complete_records(lost_nodes, where):
    outcome, storage, log = outcome_of(lost_nodes, where)
    assert "error" not in outcome and outcome["finished"], log[-4000:]
    assert outcome["checkpoints_before_loss"] >= 1
    assert outcome["return_value"]["step"] == 5 * 8 and outcome["return_value"]["resumed_from_epoch"] is not None
    assert len(set(outcome["digests"])) == 1 and outcome["worker_errors"]

    records = open_records(f"{storage}/node-loss")
    first, second = records.segments()
    assert second.complete
    if where == "local":
        assert verify_run(second.path).ok
        assert outcome["not_uploaded"] == []
    else:
        # The lost node took its staging folder along (here the simulated node's folder is on this
        # machine, and removed by the test): the driver says which segment stays as last uploaded,
        # unless rank 0 closed and uploaded it when the other rank died first.
        assert len(outcome["not_uploaded"]) <= 1
        assert all("segment-000" in m and "its local copy is" in m for m in outcome["not_uploaded"])
    # The lost attempt's segment: cut off (no run_end), or closed by rank 0 with the error its
    # collective raised when the other rank died first; which one depends on who dies first.
    last = json.loads(records.events().filter(pc.equal(records.events()["segment"], 0))["line"][-1].as_py())
    assert not first.complete or "error" in last, last
    assert second.link["previous"]["segment"] == "segment-000" and second.link["attempt"] == 1
    resumed_step = second.link["step_offset"]
    assert resumed_step == 8 * (outcome["return_value"]["resumed_from_epoch"] + 1)
    metrics = records.metrics()
    by_segment = list(zip(metrics.column("segment").to_pylist(), metrics.column("run_step").to_pylist()))
    lost = [step for segment, step in by_segment if segment == 0]
    assert set(range(0, resumed_step, 3)) <= set(lost)  # nothing up to the checkpoint is missing
    assert [step for segment, step in by_segment if segment == 1] == list(range(resumed_step, 40, 3))


@pytest.mark.timeout(1000)
def test_without_a_replacement_node_the_wait_is_bounded_by_the_controller_failure_limit(lost_nodes):
    outcome, storage, log = outcome_of(lost_nodes, "bounded")
    assert outcome["finished"], log[-4000:]
    assert outcome["error"].startswith("ControllerError") and "worker group startup timed out" in outcome["error"]
    assert outcome["seconds_after_loss"] < 120
    records = open_records(f"{storage}/node-loss")
    first = records.segments()[0]  # the lost node's record is in storage
    last = json.loads(records.events()["line"][-1].as_py())
    assert first.events > 0 and (not first.complete or "error" in last), last  # cut off, or closed with the error
