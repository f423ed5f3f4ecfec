"""`ray-ormas goodput RUN`: where a run's time went, from its record on any storage.

Each fit's account (record/goodput.py, from the fit's timeline in `ormas/goodput/`), then the
whole run's; `--json` prints the same as one JSON object. Also the tail of `ray-ormas report`.

Hooks relied on: none (the record's readers).
"""

from __future__ import annotations

import json
import logging

from ray_ormas._internal.record.goodput import duration
from ray_ormas._internal.record.reader import RunRecords

logger = logging.getLogger("ray_ormas.cli")


def print_goodput(records: RunRecords, as_json: bool = False) -> int:
    """Print every fit's account and the run's; 2 when the run has none (no fit kept a timeline)."""
    fits = records.goodput_per_fit()
    if not fits:
        logger.error(
            "ray-ormas goodput: no goodput timeline under %s (its goodput/ folder): the run was "
            "trained by a ray-ormas older than the goodput account",
            records.store.shown(),
        )
        return 2
    run = records.goodput()
    assert run is not None
    if as_json:
        print(json.dumps({"fits": [a.to_dict() for a in fits], "run": run.to_dict()}, indent=1, default=str))
        return 0
    for n, account in enumerate(fits):
        state = "" if account.closed else " (still running, or its driver ended before closing it)"
        print(f"fit {n + 1} of {len(fits)}{state}: {account.line()}")
        print(_indented(account.table()))
    if len(fits) > 1:
        print(f"the whole run, {len(fits)} fits: {run.line()}")
        print(_indented(run.table()))
    return 0


def goodput_lines(records: RunRecords) -> list[str]:
    """The lines `ray-ormas report` ends with: each fit's one line, and the run's."""
    fits = records.goodput_per_fit()
    out = [f"goodput of fit {n + 1}: {a.line()}" for n, a in enumerate(fits)]
    run = records.goodput()
    if run is not None and len(fits) > 1:
        out.append(f"goodput of the whole run ({len(fits)} fits, {duration(run.wall_s)}): {run.line()}")
    return out


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
