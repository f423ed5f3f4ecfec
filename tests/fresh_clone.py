"""A fresh clone of the repository with the README's demo command run in it, as a new user
would: shared by the tests of the docs' commands (test_doc_commands.py) and of the demo
(test_demo_and_cli.py), so the demo runs once per test session.

The command is `SETUP && DEMO`: the virtual environment and the install, then the demo. The
setup begins in the background when the session starts (`CloneSetup`, from tests/conftest.py)
and runs while the tests that need neither Ray nor processes of their own run (they go first);
`make_clone` waits for it and then runs the demo in the same folder and environment, only if
the setup succeeded, as `&&` would. The install is the slowest step of the suite; most of it
now overlaps other work.

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
SETUP, DEMO = README_DEMO.text.rsplit(" && ", 1)  # the venv and the install; `.venv/bin/ray-ormas demo`


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


class CloneSetup:
    """The repository's files copied to a new folder, and the README demo command's setup begun
    there in its own session (its output goes to a file: nobody reads a pipe while it runs)."""

    def __init__(self, base: Path) -> None:
        root = base / "ray-ormas"
        files = repository_files()
        for rel in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, root / rel)
        self.clone = Clone(root, files, base)
        self.env = self.clone.env(base / "home-demo")
        self.log = base / "setup.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", SETUP],
                cwd=root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout: float) -> Ran:
        """The setup's outcome, once it has finished (killed and failed after `timeout` s)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            pytest.fail(
                f"`{SETUP}` did not finish in {timeout:.0f} s; its output ended with:\n{self.log.read_text()[-3000:]}"
            )
        finally:
            kill_group(self.proc)
        return Ran(code, self.log.read_text(), self.clone.root)

    def stop(self) -> None:
        kill_group(self.proc)
        self.proc.wait(timeout=30)


def make_clone(setup: CloneSetup) -> Clone:
    """The clone once its setup has finished, with the README's demo run in it if it succeeded."""
    c = setup.clone
    done = setup.wait(timeout=1200)
    if done.code != 0:
        c.demo = done
        return c
    demo = bash(DEMO, cwd=c.root, env=setup.env, timeout=900)
    c.demo = Ran(demo.code, done.out + demo.out, c.root)
    return c
