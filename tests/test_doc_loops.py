"""The docs' training loops at the size their own runs never reach: one rank. Their snippets run
as written on 2 workers (tests/test_doc_commands.py); an elastic range `(1, N)` or a Tune trial
with one worker runs the same loop at world size 1, where Ray Train adds no `DistributedSampler`
(a loop calling `loader.sampler.set_epoch` unguarded fails there with AttributeError). Here each
snippet's loop, its imports and definitions taken from the text and nothing else, runs in Ray
Train's local mode (`num_workers=0`: the loop in this process at world size 1, prepared as at one
worker), with the `train_loop_config` the snippet gives."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from ormas_monitor.record import verify_run
from ray.train import RunConfig, ScalingConfig

from ray_ormas import RayOrmasTrainer

from .doc_commands import Snippet, snippets

TRAINERS = ("RayOrmasTrainer", "TorchTrainer")


def loop_of(snippet: Snippet) -> tuple[Any, dict[str, Any]]:
    """The loop function the snippet hands its trainer, defined by the snippet's own imports and
    definitions, and the snippet's `train_loop_config` (a literal) or {}."""
    tree = ast.parse(snippet.code)
    (call,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) in TRAINERS
    ]
    config = next((ast.literal_eval(k.value) for k in call.keywords if k.arg == "train_loop_config"), {})
    definitions = ast.Module(
        body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))],
        type_ignores=[],
    )
    scope: dict[str, Any] = {"__name__": "doc_loop"}
    exec(compile(definitions, snippet.id, "exec"), scope)
    return scope[ast.unparse(call.args[0])], config


PLAIN = [s for s in snippets() if s.install is None]  # Lightning and Transformers have tests of their own


@pytest.mark.usefixtures("ray_cluster")  # local mode starts Ray when none is running
@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", PLAIN, ids=[s.id for s in PLAIN])
def test_the_docs_loop_runs_at_one_rank(snippet: Snippet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # a snippet's relative paths land here
    loop, config = loop_of(snippet)
    result = RayOrmasTrainer(
        loop,
        train_loop_config=config,
        verbose=False,
        mlflow=False,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="one-rank", storage_path=str(tmp_path / "runs")),
    ).fit()
    assert result.ormas.final["ormas/steps_per_rank"][0] > 0
    assert verify_run(result.ormas.record_dir).ok


def test_the_readme_quickstart_and_adoption_loops_are_among_them():
    assert {s.doc for s in PLAIN} >= {"README.md", "docs/quickstart.md", "docs/adoption.md"}, [s.id for s in PLAIN]
