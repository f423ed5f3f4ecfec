"""ray-ormas's messages go through `logging` (ray_ormas/logs.py): shown by default, once, on the
right stream; through the user's configuration when there is one; silenced the standard way.
Each case is a fresh Python process, as a user's script is (pytest itself configures logging)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAY = (
    "import logging, ray_ormas\n"
    "log = logging.getLogger('ray_ormas.example')\n"
    "log.info('[ray-ormas] a note'); log.warning('[ray-ormas] a problem')\n"
)


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.timeout(120)
def test_by_default_notes_go_to_stdout_and_problems_to_stderr_once():
    ran = python(SAY)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "[ray-ormas] a note\n" and ran.stderr == "[ray-ormas] a problem\n"


@pytest.mark.timeout(120)
def test_a_users_logging_configuration_gets_the_records_instead_once():
    ran = python("import logging; logging.basicConfig(format='%(levelname)s %(name)s: %(message)s')\n" + SAY)
    assert ran.stdout == ""
    assert ran.stderr.splitlines() == [
        "INFO ray_ormas.example: [ray-ormas] a note",
        "WARNING ray_ormas.example: [ray-ormas] a problem",
    ]


@pytest.mark.timeout(120)
def test_setting_the_level_silences_the_notes():
    ran = python("import logging, ray_ormas; logging.getLogger('ray_ormas').setLevel(logging.WARNING)\n" + SAY)
    assert ran.stdout == "" and ran.stderr == "[ray-ormas] a problem\n"


def test_the_package_prints_only_command_output():
    """Messages are log records; `print` is left for what a command outputs (tables, paths, YAML)."""
    allowed = {"cli.py", "demo.py", "train_command.py", "job_config.py"}
    for path in sorted((ROOT / "ray_ormas").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                assert path.name in allowed, f"{path.name}:{node.lineno} prints; use logging.getLogger(__name__)"
                assert not any(k.arg == "file" for k in node.keywords), (
                    f"{path.name}:{node.lineno} prints a message to a stream; log it"
                )
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "write"
                and path.name != "logs.py"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("stdout", "stderr")
            ):
                raise AssertionError(f"{path.name}:{node.lineno} writes to sys.{node.value.attr}; log it")
