"""A simulated node made slow for real: its worker processes under a cgroup v1 CPU quota.

`CpuQuota(node)` creates a cgroup in the `cpu` controller (this machine and CI run as root, with
/sys/fs/cgroup/cpu writable) whose processes get `share` of one CPU in every 10 ms, and, on a
thread, moves into it every process the node's raylet starts (its Ray workers: Ray Train's ranks,
the other job's), each as soon as it appears. The raylet itself stays out, so that the node keeps
answering Ray's health checks. `release()` moves every process back to the root cgroup and
removes the cgroup: the node is as fast as the others again.

Ray's `Node.all_processes` (the raylet's pid) is a private attribute of `ray.cluster_utils`'s
nodes: a test helper may read it; ray-ormas never does.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000


class CpuQuota:
    """The node's workers under a CPU quota (see the module docstring)."""

    def __init__(self, node: Any, share: float = 0.2) -> None:
        self.raylet = node.all_processes["raylet"][0].process.pid
        self.group = CPU_CGROUP / f"ray-ormas-slow-node-{os.getpid()}-{self.raylet}"
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * share)))
        self.moved: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="cpu-quota", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(0.05):
            found = subprocess.run(["pgrep", "-P", str(self.raylet)], capture_output=True, text=True).stdout.split()
            for pid in map(int, found):
                if pid not in self.moved:
                    try:
                        (self.group / "cgroup.procs").write_text(str(pid))
                        self.moved.add(pid)
                    except OSError:  # it ended meanwhile
                        pass

    def release(self) -> None:
        """Every process back in the root cgroup, and the cgroup removed."""
        self._stop.set()
        self._thread.join(timeout=5)
        if not self.group.exists():  # released already
            return
        for pid in (self.group / "cgroup.procs").read_text().split():
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.group.rmdir()
        except OSError:
            pass
