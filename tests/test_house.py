"""The house rules, run by the README's test command (so CI runs them): ruff (lint and format),
mypy on the package, the import contracts (import-linter, configured in pyproject.toml), what a
worker's imports load, the public surface and its errors.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ray_ormas
from ray_ormas import errors

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run_tool(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())},
    )


def test_ruff_finds_nothing_to_lint():
    done = run_tool(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_nothing_to_format():
    done = run_tool(str(BIN / "ruff"), "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_passes_on_the_package():
    done = run_tool(str(BIN / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_import_contracts_are_kept():
    done = run_tool(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


# What a worker process imports: the loop's API and the function Ray runs (the framework callbacks are
# covered by the import contracts: importing Lightning and Transformers here would cost 15 s).
WORKER_ENTRY = ("ray_ormas", "ray_ormas._internal.worker.api", "ray_ormas._internal.worker.loop")
HEAD_SIDE = (
    "ray_ormas._internal.head",
    "ray_ormas._internal.tracking",
    "ray_ormas._internal.driver",
    "ray_ormas._internal.cli",
    "mlflow",
)


def test_importing_what_a_worker_needs_loads_nothing_of_the_head_side():
    code = (
        "import sys\n"
        f"for m in {WORKER_ENTRY!r}: __import__(m)\n"
        "import ray_ormas; ray_ormas.prepare_model, ray_ormas.monitor, ray_ormas.report, ray_ormas.epochs\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert "ray_ormas._internal.worker.session" in loaded  # the check sees the worker side at all
    head = [m for m in loaded if m.startswith(HEAD_SIDE)]
    assert not head, f"a worker's imports load the head side: {head}"


def test_every_error_has_the_one_base_and_its_builtin_and_is_exported():
    classes = {name: getattr(errors, name) for name in errors.__all__}
    builtins = {
        "ConfigError": ValueError,
        "OptionError": ValueError,
        "RecordStorageError": ValueError,
        "StoragePathError": ValueError,
        "RankMismatchError": RuntimeError,
        "OrmasCompatError": RuntimeError,
        "RankSyncTimeoutError": TimeoutError,
        "RaySeamChanged": RuntimeError,
    }
    assert set(classes) == {*builtins, "RayOrmasError"}
    for name, builtin in builtins.items():
        assert issubclass(classes[name], errors.RayOrmasError) and issubclass(classes[name], builtin), name
        assert getattr(ray_ormas, name) is classes[name]
    # No exception class is defined anywhere else in the package.
    for path in (ROOT / "ray_ormas").rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                assert not bases & {"Exception", "ValueError", "RuntimeError", "TimeoutError"}, (
                    f"{path}: {node.name} is an error outside ray_ormas/errors.py"
                )


def test_the_public_names_resolve_and_are_all_listed():
    for name in ray_ormas.__all__:
        assert getattr(ray_ormas, name) is not None, name
    with pytest.raises(AttributeError):
        ray_ormas.worker_session  # noqa: B018


def markers_of_every_test() -> dict[str, set[str]]:
    """Every test of the suite and its markers, from one collection (tests/marker_dump.py)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "tests.marker_dump"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line.split(" ", 2) for line in done.stdout.splitlines() if line.startswith("markers: ")]
    return {parts[1]: set(filter(None, (parts[2] if len(parts) > 2 else "").split(","))) for parts in lines}


def selected(expression: str, tests: dict[str, set[str]]) -> set[str]:
    """The tests `pytest -m expression` runs (a marker expression is a Python boolean expression)."""
    names = {word for word in expression.replace("(", " ").replace(")", " ").split()} - {"and", "or", "not"}
    return {t for t, marks in tests.items() if eval(expression, {}, {n: n in marks for n in names})}


@pytest.mark.system  # a pytest session of its own
@pytest.mark.timeout(600)
def test_the_tiers_in_contributing_select_what_it_says():
    text = (ROOT / "docs" / "contributing.md").read_text()
    fast_smoke, fast, no_system = re.findall(r'python -m pytest -m "([^"]+)"', text)
    assert (fast_smoke, fast, no_system) == ("smoke or not ray and not system", "not ray and not system", "not system")
    everything = markers_of_every_test()
    tiers = {
        name: selected(expr, everything)
        for name, expr in [("fast", fast), ("smoke", fast_smoke), ("no_system", no_system)]
    }
    assert tiers["fast"] < tiers["smoke"] < tiers["no_system"] < set(everything)
    assert "tests/test_house.py::test_the_import_contracts_are_kept" in tiers["fast"]
    assert not any(
        t.startswith(("tests/test_ddp_training.py", "tests/test_doc_commands.py::test_the_")) for t in tiers["fast"]
    )
    smoke = tiers["smoke"] - tiers["fast"]
    assert 2 <= len(smoke) <= 6, smoke  # one representative fit of each kind
    assert all("ray" in everything[t] for t in smoke)
    assert not any(t.startswith("tests/test_doc_commands.py::test_the_") for t in tiers["no_system"])


def test_the_fit_budget_is_the_one_contributing_gives():
    from .fit_count import FIT_BUDGET

    text = (ROOT / "docs" / "contributing.md").read_text()
    (budget,) = re.findall(r"at most \*\*(\d+) Ray Train fits\*\*", text)
    assert int(budget) == FIT_BUDGET


def test_the_fit_counter_counts_each_cluster_and_fit_once_and_credits_the_test_running(tmp_path):
    from .fit_count import CONTROLLER_LOG, FitCounter, session_folders

    def session(root: Path, name: str, fits: int) -> Path:
        train = root / name / "logs" / "train"
        train.mkdir(parents=True, exist_ok=True)
        for i in range(fits):
            (train / CONTROLLER_LOG.replace("*", f"{name}-{i}")).touch()
            (train / f"ray-train-app-controller-{name}-{i}.log").touch()  # the same fit's other log
        return root / name

    old = session(tmp_path / "ray", "session_2026-01-01_00-00-00_1", 3)  # before the session: not counted
    counter = FitCounter(tmp_path)
    counter.baseline()
    counter.current = "tests/test_a.py::test_one"
    session(tmp_path / "ray", "session_2026-01-01_00-00-00_1", 4)  # a fit more on an old cluster
    session(tmp_path / "ray", "session_2026-01-01_00-00-01_2", 2)  # the default temp dir
    (tmp_path / "ray" / "session_latest").symlink_to(old)  # Ray's link: not a cluster of its own
    counter.scan()
    counter.current = "tests/test_b.py::test_two"
    session(tmp_path / "rod-head-7", "session_2026-01-01_00-00-02_3", 1)  # `ray start --temp-dir`
    session(tmp_path / "mine" / "ray", "session_2026-01-01_00-00-03_4", 1)  # RAY_TMPDIR=/tmp/mine
    counter.scan()
    counter.scan()  # nothing new: nothing counted twice
    assert dict(counter.fits) == {"tests/test_a.py::test_one": 3, "tests/test_b.py::test_two": 2}
    assert dict(counter.clusters) == {"tests/test_a.py::test_one": 1, "tests/test_b.py::test_two": 2}
    assert counter.by_file(counter.fits) == {"tests/test_a.py": 3, "tests/test_b.py": 2}
    assert session_folders(tmp_path / "removed-meanwhile") == set()  # a scan never raises
