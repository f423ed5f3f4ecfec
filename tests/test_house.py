"""The house rules, run by the README's test command (so CI runs them): ruff (lint and format),
mypy on the package, the import contracts (import-linter, configured in pyproject.toml), what a
worker's imports load, the public surface and its errors.
"""

from __future__ import annotations

import ast
import builtins
import importlib
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
        "JournalError": ValueError,
        "RankMismatchError": RuntimeError,
        "OrmasCompatError": RuntimeError,
        "RankSyncTimeoutError": TimeoutError,
        "RaySeamChanged": RuntimeError,
        "OptionTypeError": TypeError,
        "UsageError": RuntimeError,
        "CheckpointError": ValueError,
        "CheckpointNotFoundError": FileNotFoundError,
        "MissingExtraError": ImportError,
        "FleetStopError": RuntimeError,
        "FleetReattemptError": RuntimeError,
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


# Where the package may raise a plain builtin: invariants no user input can reach, each with why.
PLAIN_RAISES_ALLOWED = {
    ("ray_ormas/_internal/worker/plan.py", "RuntimeError"): "Ray started a size outside the range the driver "
    "split the batch for: a bug in ray-ormas or Ray, said so",
    ("ray_ormas/__init__.py", "AttributeError"): "a module's __getattr__ (PEP 562) must raise AttributeError: "
    "what `hasattr` and `from ray_ormas import name` expect",
    ("ray_ormas/_internal/worker/supervised_loop.py", "ValueError"): "the CLI runs the built-in loop only with "
    "the config's model and data sections, which its schema requires",
    **{
        ("ray_ormas/_internal/worker/preflight.py", name): "a pre-flight probe's failure, caught where it is raised "
        "and recorded as the probe's `broken` reason: never raised to the user"
        for name in ("ArithmeticError", "TimeoutError", "TypeError")
    },
}
BUILTIN_ERRORS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, Exception)
}


def test_every_error_a_user_can_meet_is_a_ray_ormas_error():
    """No `raise ValueError(...)` (or any builtin) in the package, except in a pydantic validator
    (pydantic wraps what it raises into its ValidationError, which names the field) and the
    invariants allowed above; an error re-raised as it came (`raise`, `raise e`) is the user's own."""
    found = []
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        in_validators = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef)
            and any("validator" in ast.unparse(d) for d in function.decorator_list)
            for node in ast.walk(function)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and id(node) not in in_validators:
                name = ast.unparse(node.exc.func)
                if name in BUILTIN_ERRORS and (relative, name) not in PLAIN_RAISES_ALLOWED:
                    found.append(f"{relative}:{node.lineno}: raise {name}(...)")
    assert not found, "plain builtins a user can meet (raise a ray_ormas.errors class):\n" + "\n".join(found)


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


# ---------------------------------------------------------------- every name the text gives
DOTTED = re.compile(r"\bray_ormas(?:\.[A-Za-z_]\w*)+")


def dotted_names_in_the_text() -> dict[str, str]:
    """Every dotted `ray_ormas.*` name that README.md, docs/, examples/ and the package's own
    strings (messages, docstrings, reprs) give, with the first place that gives it."""
    found: dict[str, str] = {}
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in (".py", ".yaml", ".md"))
    for path in texts:
        for name in DOTTED.findall(path.read_text()):
            found.setdefault(name, str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in DOTTED.findall(node.value):
                    found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def names_that_are_not_python() -> set[str]:
    """The dotted strings that name something else, read from where that thing is defined: the
    package's loggers (`get_logger("ray_ormas....")`, `logging.getLogger`) and the MLflow tags docs/mlflow.md lists
    (each also written by the package's tracking code)."""
    loggers = set()
    for path in (ROOT / "ray_ormas").rglob("*.py"):
        loggers |= set(re.findall(r"(?:get_logger|getLogger)\(\"(ray_ormas[\w.]*)\"\)", path.read_text()))
    (row,) = [line for line in (ROOT / "docs" / "mlflow.md").read_text().splitlines() if line.startswith("| Tags |")]
    tags = set(DOTTED.findall(row))
    tracking = "".join(p.read_text() for p in (ROOT / "ray_ormas" / "_internal").rglob("*.py"))
    assert tags and all(f'"{tag}"' in tracking for tag in tags), tags
    return loggers | tags


def resolve(dotted: str) -> object:
    """The module or attribute a dotted name gives: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj: object = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # the module exists, and something it imports does not
                raise
            continue
        for attribute in parts[i:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_dotted_name_the_docs_examples_and_messages_give_resolves():
    skip = names_that_are_not_python()
    unresolved = []
    for name, where in sorted(dotted_names_in_the_text().items()):
        if name in skip:
            continue
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            unresolved.append(f"{name} ({where}): {type(e).__name__}: {e}")
    assert not unresolved, "names the text gives that do not exist:\n" + "\n".join(unresolved)


@pytest.mark.parametrize(
    "module, frameworks, extra",
    [
        ("ray_ormas.lightning", ["lightning", "pytorch_lightning"], "lightning"),
        ("ray_ormas.transformers", ["transformers"], "transformers"),
    ],
)
def test_the_framework_modules_without_their_framework_say_what_to_install(module, frameworks, extra):
    # The framework made unimportable in a fresh interpreter (a None in sys.modules fails its import).
    code = f"import sys; sys.modules.update(dict.fromkeys({frameworks!r}))\nimport {module}"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "MissingExtraError" in done.stderr, done.stderr[-2000:]  # an ImportError
    assert f"{module} needs" in done.stderr and f"pip install 'ray-ormas[{extra}]'" in done.stderr, done.stderr[-2000:]


def test_the_declared_floors_of_ray_and_ormas_monitor_are_what_ci_installs():
    import tomllib

    from packaging.version import Version

    from ray_ormas._internal.seams.ray_train import TESTED

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {re.match(r"[\w-]+", d).group(0): Version(re.search(r">=([\w.]+)", d).group(1)) for d in declared}
    pins = dict(re.findall(r"^([\w-]+)==([\w.]+)$", (ROOT / "constraints" / "ci.txt").read_text(), re.M))
    for package in ("ray", "ormas-monitor"):
        assert floors[package] == Version(pins[package]), (package, floors[package], pins[package])
    assert TESTED == f"ray=={pins['ray']}"


def test_docs_api_md_is_the_generated_api_reference():
    from tests.api_reference import SECTIONS, public_names, render

    listed = [name for _, _, names in SECTIONS for name in names]
    assert sorted(listed) == sorted(public_names()), "a public name is in no section of tests/api_reference.py"
    assert (ROOT / "docs" / "api.md").read_text() == render(), (
        "docs/api.md is out of date: python -m tests.api_reference > docs/api.md"
    )
