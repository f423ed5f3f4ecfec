"""The examples in examples/ run as written, on the session's Ray cluster."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(240)
def test_digits_example_repairs_and_reports_per_epoch(repaired_example_fit):
    result = repaired_example_fit.result  # digits_ddp.main(workers=2, epochs=3, repair=True, ...): tests/shared_fits.py
    assert result.ormas.final["ormas/channels_repaired"] == 32 + 64
    kinds = [per_rank[0]["ormas/kind"] for per_rank in result.ormas.reports]
    assert kinds == ["user", "user", "user", "final"]
    assert result.metrics is None  # no checkpoint was reported: Ray's Result.metrics stays None
    assert result.return_value["test_accuracy"] > 50
    assert result.ormas.report.is_file()
