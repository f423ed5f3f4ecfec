"""A real browser for the tests: headless Chromium from Debian's `chromium` package.

`render(page)` opens a local HTML file the way a person's browser does, and returns the DOM after
rendering and every message the page wrote to the browser's console (parse errors of its SVG
included). CI's setup installs the package (.ci/run) and sets RAY_ORMAS_REQUIRE_BROWSER=1, so
there a missing browser fails; elsewhere the browser tests are skipped, saying how to install it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "headless Chromium is not installed: apt-get install chromium (Debian's package; CI installs it)"
        if os.environ.get("RAY_ORMAS_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class Rendered:
    dom: str
    console: list[str]
    elements: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def having(self, css_class: str) -> list[dict[str, str]]:
        """The attributes of every element with that class, in document order."""
        return [a for _, a in self.elements if css_class in (a.get("class") or "").split()]


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def render(page: Path, screenshot: Path | None = None) -> Rendered:
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="ray-ormas-chromium-") as profile:
        base = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
        ran = subprocess.run(
            [*base, "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        if screenshot is not None:
            shot = [*base, "--hide-scrollbars", "--window-size=1300,1800", f"--screenshot={screenshot}"]
            subprocess.run([*shot, page.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    parser = _Elements()
    parser.feed(ran.stdout)
    console = [m.group(1) for m in CONSOLE.finditer(ran.stderr)]
    return Rendered(dom=ran.stdout, console=console, elements=parser.found)
