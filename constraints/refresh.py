"""Write CI's two version sets again from pyproject.toml (docs/contributing.md, "The version sets").

* `oldest.txt`: every requirement of the package and its `demo` and `test` extras at its declared
  floor, on the oldest Python that `requires-python` allows, and what those floors resolve to;
* `newest.txt`: what a resolver picks today for the same requirements on the newest Python the
  range allows: the newest release of each that installs.

Both are complete (every package pinned), so CI installs the same thing on every run until they
are written again. The resolver is uv (`pip install uv`): it resolves for a Python that need not
be installed here. The installs are pip's (`.ci/version_sets`).

    python constraints/refresh.py            # both sets
    python constraints/refresh.py newest     # the newest only: after a dependency's new release
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
EXTRAS = ("demo", "test")
PLATFORM = "x86_64-manylinux_2_28"  # CI's machine
PYTHON_MINORS = range(8, 20)  # the 3.x minors a range is looked at for

logger = logging.getLogger("constraints.refresh")


def requirements(project: dict, extras: tuple[str, ...] = EXTRAS) -> list[Requirement]:
    """The package's own requirements and those of `extras`, with the extras they name of the
    package itself (`ray-ormas[lightning]`) followed."""
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        for req in map(Requirement, project["optional-dependencies"][extra]):
            if req.name == project["name"]:
                reqs += [r for r in requirements(project, tuple(req.extras)) if r not in reqs]
            else:
                reqs.append(req)
    return reqs


def floors(reqs: list[Requirement]) -> dict[str, str]:
    """Each requirement's `>=` floor, by name: what oldest.txt must hold."""
    found: dict[str, str] = {}
    for req in reqs:
        for spec in req.specifier:
            if spec.operator == ">=":
                found[req.name.lower()] = spec.version
    return found


def python_range(project: dict) -> tuple[str, str]:
    """The oldest and the newest Python 3 minor that `requires-python` allows."""
    allowed = SpecifierSet(project["requires-python"])
    minors = [f"3.{m}" for m in PYTHON_MINORS if allowed.contains(f"3.{m}.0")]
    if not minors:
        raise SystemExit(f"requires-python {allowed} allows no Python 3.{PYTHON_MINORS[0]}-3.{PYTHON_MINORS[-1]}")
    return minors[0], minors[-1]


def compile_set(name: str, python: str, pinned: dict[str, str]) -> None:
    """Resolve the package's requirements for `python` with `pinned` held, into constraints/NAME.txt."""
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv resolves the sets for Pythons not installed here: pip install uv")
    out = ROOT / "constraints" / f"{name}.txt"
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as held:
        held.write("".join(f"{n}=={v}\n" for n, v in sorted(pinned.items())))
        held.flush()
        cmd = [uv, "pip", "compile", str(PYPROJECT), *(f"--extra={e}" for e in EXTRAS)]
        cmd += ["--python-version", python, "--python-platform", PLATFORM, "--constraint", held.name]
        cmd += ["--no-header", "--no-annotate", "--quiet", "-o", str(Path(held.name).with_suffix(".out"))]
        resolved = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if resolved.returncode != 0:
            raise SystemExit(f"the {name} set does not resolve:\n{resolved.stderr}")
        pins = Path(held.name).with_suffix(".out").read_text()
        Path(held.name).with_suffix(".out").unlink()
    held_text = "the floors of pyproject.toml held" if pinned else "nothing held"
    header = (
        f"# The {name} version set: Python {python}, {held_text}. Written by\n"
        "# `python constraints/refresh.py`; do not edit. CI installs it (.ci/version_sets), and\n"
        "# tests/test_version_sets.py compares it with pyproject.toml (docs/contributing.md).\n"
    )
    out.write_text(header + pins)
    logger.info("wrote %s (Python %s, %d packages)", out.relative_to(ROOT), python, pins.count("=="))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="*", metavar="oldest|newest", help="the sets to write (default: both)")
    chosen = parser.parse_args().sets or ["oldest", "newest"]
    if unknown := set(chosen) - {"oldest", "newest"}:
        parser.error(f"no set {sorted(unknown)}: the sets are oldest and newest")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    oldest_python, newest_python = python_range(project)
    if "oldest" in chosen:
        compile_set("oldest", oldest_python, floors(requirements(project)))
    if "newest" in chosen:
        compile_set("newest", newest_python, {})


if __name__ == "__main__":
    sys.exit(main())
