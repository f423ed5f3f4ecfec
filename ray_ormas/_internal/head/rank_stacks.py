"""Where each rank of an attempt runs, and its Python stacks read there: what a `diagnose` action
captures (head/fleet_actions.py), on the head node, inside the run ledger actor.

`stacks_of_ranks` runs py-spy's `dump` in a Ray task pinned to each named rank's node, all at
once, and waits for them together at most STACKS_BOUND_S; a dump not back by then is cancelled
and said. A node without py-spy, or one where the rank's process cannot be read (py-spy needs
ptrace rights: docs/kuberay.md, "Fleet actions on KubeRay"), gives its reason instead of a stack.

Hooks relied on: `ray.remote` tasks with `NodeAffinitySchedulingStrategy`, `ray.wait`,
`ray.cancel`, py-spy's `dump --pid` command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

STACK_TIMEOUT_S = 30.0  # py-spy's dump of one rank
STACKS_BOUND_S = STACK_TIMEOUT_S + 15  # every named rank's dump, in parallel; later ones are cancelled
STACK_CHARS = 20_000  # at most this much of one rank's stacks is kept
PY_SPY_ENV = "RAY_ORMAS_PY_SPY"  # a py-spy to run instead of the one beside Python or on PATH


@dataclass(frozen=True)
class RankHandle:
    """Where one rank of an attempt runs: its Ray Train worker actor, node and process."""

    rank: int
    actor: Any
    node_id: str
    node: str
    pid: int


def stacks_of_ranks(handles: list[RankHandle]) -> dict[int, str]:
    """rank -> py-spy's dump of its process, run on its node, all at once; the reason when it
    cannot. A dump not back within STACKS_BOUND_S is cancelled."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    said: dict[int, str] = {}
    refs: dict[int, Any] = {}
    for handle in handles:
        try:
            task = _dump.options(scheduling_strategy=NodeAffinitySchedulingStrategy(handle.node_id, soft=False))
            refs[handle.rank] = task.remote(handle.pid)
        except Exception as e:
            said[handle.rank] = f"could not capture the stacks of rank {handle.rank}: {type(e).__name__}: {e}"
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=STACKS_BOUND_S) if refs else ([], [])
    for rank, ref in refs.items():
        if ref not in ready:
            ray.cancel(ref, force=True)
            said[rank] = (
                f"could not capture the stacks of rank {rank}: no answer within {STACKS_BOUND_S:g} s (cancelled)"
            )
            continue
        try:
            said[rank] = str(ray.get(ref))[:STACK_CHARS]
        except Exception as e:
            said[rank] = f"could not capture the stacks of rank {rank}: {type(e).__name__}: {e}"
    return said


def py_spy() -> str | None:
    """The py-spy this node runs: $RAY_ORMAS_PY_SPY (the KubeRay `diagnose` overlay's, which may
    read other processes), else the one installed beside this Python, else the one on PATH."""
    given = os.environ.get(PY_SPY_ENV)
    if given:
        return given if Path(given).exists() else None
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump_command(pid: int) -> list[str] | None:
    """The command line that dumps process `pid`'s stacks on this node (None: no py-spy here)."""
    spy = py_spy()
    return None if spy is None else [spy, "dump", "--pid", str(pid)]


def dump_stacks(pid: int) -> str:
    """py-spy's `dump` of process `pid` (on this node); its error text when it fails."""
    command = dump_command(pid)
    if command is None:
        return f"py-spy is not installed on this node (pip install py-spy, or set {PY_SPY_ENV})"
    done = subprocess.run(command, capture_output=True, text=True, timeout=STACK_TIMEOUT_S, check=False)
    if done.returncode != 0:
        return f"py-spy could not read process {pid}: {(done.stderr or done.stdout).strip()[-2000:]}"
    return done.stdout


_dump = ray.remote(num_cpus=0, max_retries=0)(dump_stacks)  # on a rank's node (stacks_of_ranks)
