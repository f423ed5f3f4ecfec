"""ray-ormas's messages go through `logging` (ray_ormas/_internal/common/logs.py): shown by default, once, on the
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
    allowed = {
        "_internal/cli/main.py",
        "_internal/cli/goodput.py",
        "demo.py",
        "_internal/cli/train.py",
        "_internal/common/job_config.py",
    }
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        rel = path.relative_to(ROOT / "ray_ormas").as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                assert rel in allowed, f"{rel}:{node.lineno} prints; use common/logs.py get_logger"


def test_the_prefixes_come_from_the_logger_not_from_each_message():
    ran = python(
        "from ray_ormas._internal.common.logs import get_logger\n"
        "log = get_logger('ray_ormas.worker')\n"
        "log.info('a note'); log.warning('could not %s', 'upload', rank=3)\n"
    )
    assert ran.stdout == "[ray-ormas] a note\n" and ran.stderr == "[ray-ormas] rank 3: could not upload\n"
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        if path.name != "logs.py":
            assert "[ray-ormas]" not in path.read_text(), f"{path}: the prefix is get_logger's, not the message's"
