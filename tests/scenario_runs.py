"""The simulated multi-node scenarios (tests/scenarios/), run side by side.

Each scenario is a subprocess with a Ray cluster of its own (`ray.cluster_utils.Cluster`) whose
fits mostly wait: for a node to die or join, for Ray Data's autoscaling coordinator (every
20 s), for a sleep in the loop. Run one after the other they cost the sum of those waits; side
by side, about the longer one (measured: 267 s for both, against 171 s and 216 s one after the
other). `multi_node` (tests/conftest.py) starts every scenario a selected test needs when the
first of them is asked for, and waits for all of them there, so that they never share the
machine with the session's own fits (whose timings some tests judge); each test module then
reads its own (`ScenarioRun.wait`: a scenario that ran past its timeout had its process group
killed, and its tests fail with its log).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ScenarioRun:
    """One scenario's subprocess: `python -m tests.scenarios.NAME ARGS...`."""

    module: str
    args: list[str]
    timeout_s: float
    proc: subprocess.Popen | None = None
    log: str | None = None
    hung: bool = False

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"tests.scenarios.{self.module}", *self.args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def finish(self) -> None:
        """Wait for the scenario to end (its process group is killed past its timeout)."""
        assert self.proc is not None
        if self.log is None:
            try:
                self.log, _ = self.proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.log, _ = self.proc.communicate()
                self.hung = True

    def wait(self) -> str:
        """The scenario's log once it exited with 0; the test fails otherwise."""
        self.finish()
        assert self.proc is not None and self.log is not None
        if self.hung:
            pytest.fail(f"the {self.module} scenario hung:\n{self.log[-4000:]}")
        assert self.proc.returncode == 0, self.log[-4000:]
        return self.log

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()


# A scenario's bound (its process group is killed past it), for a machine twice as slow as the
# slowest day measured: the elastic chain took 457 s on a normal day and ran past the 750 s it
# had on 2026-12-07 (30 million Python additions in 4.0 s, against 2.0-2.8 s).
SCENARIO_TIMEOUT_S = 1500
# The pytest timeout of a test that may be the first to ask for `multi_node` (its setup waits for
# every scenario): past the scenarios' own, so that a scenario past its bound fails with its log.
PHASE_TIMEOUT_S = SCENARIO_TIMEOUT_S + 100

STRATEGIES = ("ddp", "fsdp")  # tests/test_elastic.py: one elastic fit each
ACTS = "acts"  # tests/test_fleet_actions.py: the fleet's actions, after the elastic fits on their cluster
# tests/test_node_loss.py, in this order (the last leaves no node): name -> mode
NODE_LOSS_FITS = {"evict": "evict", "local": "replace", "s3": "replace", "bounded": "no-replacement"}


def elastic_run(base: Path, fits: list[str]) -> ScenarioRun:
    """The elastic scenario's `fits` (of STRATEGIES and ACTS), one after the other on one
    simulated cluster: their outcomes and runs under `base`."""
    return ScenarioRun("elastic", [str(base / "runs"), str(base), ",".join(fits)], timeout_s=SCENARIO_TIMEOUT_S)


def node_loss_run(base: Path, storage: dict[str, str]) -> ScenarioRun:
    """The node-loss scenario's fits (`NODE_LOSS_FITS`), each with its storage: outcomes under `base`."""
    fits = [f"{name}={mode}@{storage[name]}" for name, mode in NODE_LOSS_FITS.items()]
    return ScenarioRun("node_loss", [str(base), *fits], timeout_s=SCENARIO_TIMEOUT_S)
