"""A fresh clone of the repository with the README's demo command run in it, as a new user
would: shared by the tests of the docs' commands (test_doc_commands.py) and of the demo
(test_demo_and_cli.py), so the demo runs once per test session.

Every process a test starts here runs in its own session and is killed by its process group;
Ray daemons that appear during a command and outlive it are killed by pid, and the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .doc_commands import ROOT, harvest

RAY_DAEMONS = ("raylet", "gcs_server")
README_DEMO = next(c for c in harvest() if c.doc == "README.md" and c.block is not None)


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    cwd: Path


def ray_daemons(home: str) -> set[int]:
    """Ray daemons started by a command run with HOME=`home` (they inherit its environment), and
    no one else's: the session's own cluster and other tests' heads have other HOMEs."""
    found = set()
    mark = f"HOME={home}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if name in RAY_DAEMONS and mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(int(pid))
        except OSError:
            continue
    return found


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def bash(script: str, *, cwd: Path, env: dict[str, str], timeout: float) -> Ran:
    """Run `script` with bash in its own session; kill what it leaves; fail on leftover Ray daemons."""
    before = ray_daemons(env["HOME"])
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"`{script}` did not finish in {timeout:.0f} s; its output ended with:\n{out[-3000:]}")
    finally:
        kill_group(proc)
    deadline = time.monotonic() + 20
    while (left := ray_daemons(env["HOME"]) - before) and time.monotonic() < deadline:
        time.sleep(0.5)  # a driver's cluster shuts down as the driver exits
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"`{script}` left Ray daemons running (pids {sorted(left)}, now killed)"
    return Ran(proc.returncode, out, cwd)


@dataclass
class Clone:
    root: Path
    files: list[str]
    base: Path
    demo: Ran | None = None

    def env(self, home: Path) -> dict[str, str]:
        """The environment the docs describe: the README's venv first on PATH, nothing of ours."""
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_", "MLFLOW_", "PYTEST", "PYTHON", "VIRTUAL_ENV"))
        }
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))]
        home.mkdir(parents=True, exist_ok=True)
        keep.update(PATH=os.pathsep.join([str(self.root / ".venv" / "bin"), *path]), HOME=str(home))
        return keep

    def copy(self, name: str) -> Path:
        """A fresh working directory holding the repository's files (no venv, no outputs)."""
        work = self.base / "work" / name
        for rel in self.files:
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / rel, dest)
        return work


def repository_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return [f for f in listed if f and (ROOT / f).is_file()]


def make_clone(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """The repository's files copied to a new folder, and the README's demo command run there."""
    base = tmp_path_factory.mktemp("docs")
    root = base / "ray-ormas"
    files = repository_files()
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, root / rel)
    c = Clone(root, files, base)
    c.demo = bash(README_DEMO.text, cwd=root, env=c.env(base / "home-demo"), timeout=1500)
    return c
