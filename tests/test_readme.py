"""The README gives exactly two commands, and CI runs the test one, word for word, after only the
setup of the browser the run page's test opens (tests/browser.py): a system package, which the
README's command on a fresh clone does without (that test is then skipped, saying so); and the
start of the two more version sets' installs, which it checks after (.ci/version_sets)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [line for b in blocks for line in b.strip().splitlines()]
    assert len(commands) == 2
    demo, tests = commands
    assert demo.endswith("ray-ormas demo") and tests.endswith("python -m pytest")
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    browser = [
        "command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq chromium; }",
        "export RAY_ORMAS_REQUIRE_BROWSER=1",
    ]
    version_sets = ["setsid .ci/version_sets install & sets=$!", "trap 'kill -- -$sets 2>/dev/null || true' EXIT"]
    assert ci == [*browser, *version_sets, tests, "wait $sets", ".ci/version_sets check"]
