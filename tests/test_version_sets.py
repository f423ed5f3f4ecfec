"""pyproject.toml's ranges are the tested ones: its floors are constraints/oldest.txt, both ends
of each range admit what CI installs (oldest.txt, newest.txt and ci.txt), and an upper bound sits
just above what newest.txt tested (docs/contributing.md, "The version sets"). CI installs and
runs the two sets (.ci/version_sets); constraints/refresh.py writes them."""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SETS = ("oldest", "newest")
# The dependencies whose private pieces ray_ormas/_internal/seams/ leans on: bounded above.
SEAMED = {"ray", "ormas-monitor"}


def _refresh_module():
    """constraints/refresh.py, which writes the sets (constraints/ is not a package)."""
    spec = importlib.util.spec_from_file_location("constraints_refresh", ROOT / "constraints" / "refresh.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(name: str) -> dict[str, Version]:
    """A constraints file's `package==version` lines, by canonical name."""
    found = {}
    for line in (ROOT / "constraints" / f"{name}.txt").read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)", line):
            found[canonicalize_name(m[1])] = Version(m[3])
    return found


def set_python(name: str) -> Version:
    header = (ROOT / "constraints" / f"{name}.txt").read_text().splitlines()[0]
    m = re.match(r"# The \w+ version set: Python (3\.\d+),", header)
    assert m, f"constraints/{name}.txt lost the header constraints/refresh.py writes: {header!r}"
    return Version(m[1])


def next_release(version: Version, precision: int) -> Version:
    """The first release after `version`'s series at `precision` parts: 2.60.3 at 2 → 2.61."""
    parts = list(version.release[:precision]) + [0] * (precision - len(version.release))
    parts[-1] += 1
    return Version(".".join(map(str, parts)))


def upper_bounds(spec: SpecifierSet) -> list[Version]:
    return [Version(s.version) for s in spec if s.operator == "<"]


REQS = _refresh_module().requirements(PROJECT)


FLOORED = [r for r in REQS if any(s.operator == ">=" for s in r.specifier)]


def test_every_requirement_has_a_floor():
    floored = {canonicalize_name(r.name) for r in FLOORED}
    bare = [str(r) for r in REQS if canonicalize_name(r.name) not in floored]
    assert not bare, f"give {bare} a floor: the oldest set installs each requirement at its floor"


@pytest.mark.parametrize("req", FLOORED, ids=[str(r) for r in FLOORED])
def test_each_floor_is_what_the_oldest_set_installs(req: Requirement):
    (floor,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
    installed = pins("oldest").get(canonicalize_name(req.name))
    assert installed == floor, (
        f"{req}: constraints/oldest.txt has {req.name} {installed}, not the floor {floor}; "
        "write the sets again (python constraints/refresh.py) or raise the floor to what was tested"
    )


@pytest.mark.parametrize("constraints", [*SETS, "ci"])
def test_every_set_ci_installs_is_inside_the_declared_ranges(constraints: str):
    installed = pins(constraints)
    if constraints in SETS:  # complete: every requirement is pinned (ci.txt pins only some)
        unpinned = [str(r) for r in REQS if canonicalize_name(r.name) not in installed]
        assert not unpinned, f"constraints/{constraints}.txt pins no {unpinned}: write it again"
    outside = [
        f"{req}: {installed[canonicalize_name(req.name)]}"
        for req in REQS
        if canonicalize_name(req.name) in installed and installed[canonicalize_name(req.name)] not in req.specifier
    ]
    assert not outside, f"constraints/{constraints}.txt holds versions pyproject.toml refuses: {outside}"


def test_an_upper_bound_sits_just_above_what_the_newest_set_tested():
    newest = pins("newest")
    for req in REQS:
        for bound in upper_bounds(req.specifier):
            tested = newest[canonicalize_name(req.name)]
            assert bound == next_release(tested, len(bound.release)), (
                f"{req}: the newest set tested {tested}, so the bound is <{next_release(tested, len(bound.release))}"
            )
    seamed = {canonicalize_name(r.name) for r in REQS if upper_bounds(r.specifier)}
    assert SEAMED <= seamed, f"bound {sorted(SEAMED - seamed)} above: the seams lean on their private pieces"


def test_the_pythons_of_the_sets_are_both_ends_of_requires_python():
    allowed = SpecifierSet(PROJECT["requires-python"])
    oldest, newest = set_python("oldest"), set_python("newest")
    floors = [Version(s.version) for s in allowed if s.operator == ">="]
    (bound,) = upper_bounds(allowed)
    assert floors == [oldest], f"requires-python {allowed}: its floor is the oldest set's Python {oldest}"
    assert bound == next_release(newest, 2), f"requires-python {allowed}: its bound is just above {newest}"
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in allowed  # the README's own Python


def test_the_ci_runs_both_sets_after_the_readme_command():
    run = (ROOT / ".ci" / "run").read_text()
    sets = (ROOT / ".ci" / "version_sets").read_text()
    assert "setsid .ci/version_sets install & sets=$!" in run and run.rstrip().endswith(".ci/version_sets check")
    assert re.search(r"^SETS=\(oldest newest\)$", sets, re.M)
    # The fast tier the sets run is the one docs/contributing.md gives, in two parts (the tests
    # without Ray, side by side; the fits, one set at a time): each test in exactly one of them.
    fast = re.search(r'python -m pytest -m "(smoke or [^"]+)"', (ROOT / "docs" / "contributing.md").read_text())
    assert fast is not None and fast.group(1) == "smoke or not ray and not system"
    no_ray = re.search(r'^NO_RAY="([^"]+)"$', sets, re.M)
    ray_smoke = re.search(r'^RAY_SMOKE="([^"]+)"$', sets, re.M)
    assert no_ray and ray_smoke and '-m "$NO_RAY"' in sets and '-m "$RAY_SMOKE"' in sets
    for marks in itertools.product([False, True], repeat=3):
        names = dict(zip(("smoke", "ray", "system"), marks))
        parts = [eval(expr, {}, names) for expr in (no_ray.group(1), ray_smoke.group(1))]
        assert sum(parts) == eval(fast.group(1), {}, names), names  # one part exactly, where the tier has it
    done = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "version_sets")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_table_of_versions_in_the_docs_is_the_sets():
    text = (ROOT / "docs" / "contributing.md").read_text()
    head = "| package | oldest | development (ci.txt) | newest |"
    assert head in text, "docs/contributing.md lost its table of the sets' versions"
    rows = text.split(head, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    files = {"oldest": pins("oldest"), "ci": pins("ci"), "newest": pins("newest")}
    readme_python = re.search(r"python(3\.\d+) -m venv", (ROOT / "README.md").read_text())
    assert readme_python, "the README's commands name no python3.X"
    pythons = {"oldest": str(set_python("oldest")), "ci": readme_python[1], "newest": str(set_python("newest"))}
    assert rows, "the table has no rows"
    for row in rows:
        package, *shown = [cell.strip() for cell in row.strip("|").split("|")]
        for name, cell in zip(("oldest", "ci", "newest"), shown):
            if package == "Python":
                held = pythons[name]
            else:
                version = files[name].get(canonicalize_name(package))
                held = str(version) if version else "-"
            assert cell == held, f"docs/contributing.md says {package} {cell} in the {name} set; it holds {held}"
