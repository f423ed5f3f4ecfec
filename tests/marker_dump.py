"""A pytest plugin for tests/test_house.py: after collection, print each test's markers
(`-p tests.marker_dump --collect-only`), so one collection tells what every tier selects."""

from __future__ import annotations

import pytest

MARK = "markers:"


@pytest.hookimpl(trylast=True)  # after conftest.py has marked each test by its fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        print(MARK, item.nodeid, ",".join(sorted({m.name for m in item.iter_markers()})))
