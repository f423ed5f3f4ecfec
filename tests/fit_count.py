"""Counts the Ray Train fits and Ray clusters the test session starts, and prints them at its end
(docs/contributing.md keeps the budget and where the fits go, by file); pytest's cache keeps
them by test (`.pytest_cache/v/ray_ormas/fits_by_test`).

It reads what Ray itself leaves, so it counts every fit wherever it runs: in this process, in
a documented command's subprocess, under `ray job submit`, on a simulated multi-node cluster.
Every Ray cluster writes one session folder (`<temp dir>/session_<time>_<pid>`, shared by the
nodes of a `ray.cluster_utils.Cluster`), and every Ray Train fit's controller writes one
`logs/train/ray-train-sys-controller-<actor id>.log` into it (Ray Train v2's logging config,
`ray/train/v2/_internal/logging`). The temp dirs are the machine's temp folder (`/tmp/ray`,
Ray's default) and the folders directly under it (`ray start --temp-dir=/tmp/<name>`, or
`RAY_TMPDIR=/tmp/<name>`, as the tests give them). Folders that existed before the session are
not counted.

The scan runs when each test starts and ends, and every second in between on a thread (a test
that removes its head's temp dir before it ends is still counted); what a scan finds is
credited to the test running then. With the whole suite selected, a count over the budget
fails the session: the count is deterministic, unlike a time.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FIT_BUDGET = 60  # docs/contributing.md, "The budget of fits": may only go down
CONTROLLER_LOG = "ray-train-sys-controller-*.log"


def _folders(path: Path) -> list[Path]:
    """The folders in `path` (not the links to folders); none if it is gone. Other tests create
    and remove temp folders while this runs: a folder may vanish between listing and reading."""
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def session_folders(tmp: Path) -> set[Path]:
    """Every Ray session folder under the machine's temp folder, one level of temp dir deep
    (`<tmp>/<dir>/session_*` and `<tmp>/<dir>/ray/session_*`); Ray's `session_latest` link is not one."""
    return {
        session
        for top in _folders(tmp)
        for parent in (top, top / "ray")
        for session in _folders(parent)
        if session.name.startswith("session_2")
    }


@dataclass
class FitCounter:
    """What the session's scans have seen, and which test each new thing is credited to."""

    tmp: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    known_sessions: set[Path] = field(default_factory=set)
    known_fits: set[Path] = field(default_factory=set)
    fits: Counter[str] = field(default_factory=Counter)
    clusters: Counter[str] = field(default_factory=Counter)
    current: str = "(between tests)"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def baseline(self) -> None:
        self.known_sessions = session_folders(self.tmp)
        self.known_fits = {log for s in self.known_sessions for log in self._controller_logs(s)}

    @staticmethod
    def _controller_logs(session: Path) -> set[Path]:
        try:
            return set((session / "logs" / "train").glob(CONTROLLER_LOG))
        except OSError:  # removed while scanned
            return set()

    def scan(self) -> None:
        """Count what is new since the last scan. Never raises: a folder removed while it is read
        is read as empty (its fits were seen by an earlier scan, or are lost to the count)."""
        with self.lock:
            sessions = session_folders(self.tmp)
            self.clusters[self.current] += len(sessions - self.known_sessions)
            self.known_sessions |= sessions
            for session in sessions:
                new = self._controller_logs(session) - self.known_fits
                self.fits[self.current] += len(new)
                self.known_fits |= new

    def by_file(self, counts: Counter[str]) -> Counter[str]:
        files: Counter[str] = Counter()
        for nodeid, n in counts.items():
            if n:
                files[nodeid.split("::")[0]] += n
        return files


class FitCountPlugin:
    """The pytest hooks: a baseline at the session's start, a scan around every test, the totals
    and the budget at its end."""

    def __init__(self) -> None:
        self.counter = FitCounter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="fit-count", daemon=True)
        self.whole_suite = False

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            self.counter.scan()  # never raises (see FitCounter.scan)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.counter.baseline()
        self._thread.start()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        opts = session.config.option
        narrowed = any(getattr(opts, name, None) for name in ("keyword", "markexpr", "deselect", "lf", "last_failed"))
        self.whole_suite = not narrowed and all(
            Path(a.split("::")[0]).resolve() == Path(session.config.rootpath, "tests").resolve()
            for a in (session.config.args or ["tests"])
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        self.counter.scan()
        self.counter.current = item.nodeid
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        yield
        self.counter.scan()
        self.counter.current = "(between tests)"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._stop.set()
        self.counter.scan()
        total = sum(self.counter.fits.values())
        if self.whole_suite and total > FIT_BUDGET and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self.over_budget = total

    def pytest_terminal_summary(self, terminalreporter) -> None:
        c = self.counter
        fits, clusters = sum(c.fits.values()), sum(c.clusters.values())
        tr = terminalreporter
        tr.section("Ray Train fits and Ray clusters (tests/fit_count.py)")
        per_file = c.by_file(c.fits)
        cluster_files = c.by_file(c.clusters)
        for path in sorted(set(per_file) | set(cluster_files), key=lambda p: (-per_file[p], p)):
            tr.write_line(f"{per_file[path]:4d} fits {cluster_files[path]:3d} clusters  {path}")
        cache = getattr(tr.config, "cache", None)  # None with -p no:cacheprovider
        if cache is not None:
            cache.set("ray_ormas/fits_by_test", {"fits": dict(c.fits), "clusters": dict(c.clusters)})
        tr.write_line(f"ray-ormas suite: {fits} Ray Train fits on {clusters} Ray clusters (budget {FIT_BUDGET} fits)")
        if getattr(self, "over_budget", None):
            tr.write_line(
                f"FAILED: {fits} fits is over the budget of {FIT_BUDGET}: share a fit (docs/contributing.md)", red=True
            )
