"""The MLflow journal's schema and versions (tracking/journal.py), without Ray or a tracker.

The journal in tests/data/mlflow_journal_v1.json was written by ray-ormas 0.x before the journal
was a typed model (the dict `new_journal` returned, dumped by `write_journal`): a report and a
checkpoint with a NaN loss, a checkpoint without a record pointer, a finished status.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

import ray_ormas
from ray_ormas._internal.cli.main import main
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.tracking.journal import JOURNAL_VERSION, TrackingJournal
from ray_ormas._internal.tracking.sync import chosen_checkpoints, loop_entries, read_journals, write_journal

WRITTEN_BEFORE = Path(__file__).parent / "data" / "mlflow_journal_v1.json"


def a_run_with(tmp_path: Path, journal: dict | str) -> Path:
    """A record root holding the journal (and an empty segment, so that the CLI takes it as a record)."""
    root = tmp_path / "run"
    (root / ".mlflow").mkdir(parents=True)
    (root / "ormas" / "segment-000").mkdir(parents=True)
    text = journal if isinstance(journal, str) else json.dumps(journal)
    (root / ".mlflow" / "fit-0123abcd.json").write_text(text)
    return root


def test_a_journal_an_older_ray_ormas_wrote_is_read_and_written_back_byte_for_byte(tmp_path):
    run = tmp_path / "run"
    (run / ".mlflow").mkdir(parents=True)
    shutil.copy(WRITTEN_BEFORE, run / ".mlflow" / "fit-0123abcd.json")
    store = RecordStore.at(str(run))
    [journal] = read_journals(store)
    assert isinstance(journal, TrackingJournal) and journal.version == JOURNAL_VERSION == 1
    assert journal.run_id == "4f1c2d3e5a6b7c8d9e0f1a2b3c4d5e6f" and journal.status == "FINISHED"
    assert [(r.step, r.attempt) for r in journal.reports] == [(39, 0), (79, 1)]
    assert math.isnan(journal.reports[1].metrics["loss"])
    assert journal.params == {
        "scaling.num_workers": "2",
        "train_loop_config.epochs": "3",
        "train_loop_config.lr": "0.05",
    }
    # The entries a sync sends, and the checkpoint "best" chooses: the NaN loss never wins.
    assert ("accuracy", 0.93, 79) in loop_entries(journal) and ("ormas/checkpoint", 1.0, 39) in loop_entries(journal)
    assert [c.path for c in chosen_checkpoints(journal)] == ["/tmp/runs/digits/checkpoint_000000"]
    write_journal(store, journal)
    assert (run / ".mlflow" / "fit-0123abcd.json").read_bytes() == WRITTEN_BEFORE.read_bytes()


def test_a_journal_of_an_unknown_version_is_a_clear_error_and_mlflow_sync_says_it(tmp_path, caplog):
    newer = {**json.loads(WRITTEN_BEFORE.read_text().replace("NaN", "0.5")), "version": 7}
    run = a_run_with(tmp_path, newer)
    with pytest.raises(ray_ormas.JournalError) as e:
        read_journals(RecordStore.at(str(run)))
    message = str(e.value)
    assert "fit-0123abcd.json" in message and "version 7" in message and "reads version 1" in message
    assert "newer ray-ormas" in message and isinstance(e.value, ValueError)
    caplog.set_level("ERROR", logger="ray_ormas")
    assert main(["mlflow-sync", str(run)]) == 2
    assert "version 7" in caplog.text and "KeyError" not in caplog.text


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda j: j["reports"][0].update(step="late"), "reports.0.step"),
        (lambda j: j.pop("fit_id"), "fit_id"),
        (lambda j: j.update(log_checkpoints="some"), "log_checkpoints"),
    ],
)
def test_a_damaged_journal_names_the_file_and_the_field(tmp_path, change, words):
    damaged = json.loads(WRITTEN_BEFORE.read_text())
    change(damaged)
    with pytest.raises(ray_ormas.JournalError, match=words) as e:
        read_journals(RecordStore.at(str(a_run_with(tmp_path, damaged))))
    assert "fit-0123abcd.json is damaged" in str(e.value)


def test_a_journal_that_is_not_json_is_a_clear_error_and_other_files_are_passed_over(tmp_path):
    run = a_run_with(tmp_path, '{"format": "ray-ormas-mlflow", "vers')
    with pytest.raises(ray_ormas.JournalError, match="is not JSON"):
        read_journals(RecordStore.at(str(run)))
    other = a_run_with(tmp_path / "other", {"format": "someone-else", "version": 99})
    assert read_journals(RecordStore.at(str(other))) == []


# ------------------------------------------------------------------ a fit that never reached its end
def a_segment(root: Path, fit_id: str, attempt: int, *, loop_raised: bool) -> None:
    """One attempt's segment as ormas-monitor writes it (its run_end carries the pending error when
    the loop raised), linked to its fit as ray-ormas links it."""
    import torch
    from ormas_monitor import Monitor

    folder = root / "ormas" / f"segment-{attempt:03d}"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    mon = Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), out=folder, check_every=1, verbose=False)
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        mon.step()
    if loop_raised:
        try:
            raise RuntimeError("the loop's own error")
        except RuntimeError:
            mon.close(report=False)
    else:
        mon.close(report=False)
    (folder / "segment.json").write_text(json.dumps({"fit_id": fit_id, "attempt": attempt}))


@pytest.mark.parametrize(
    "attempts, ended",
    [([False], True), ([True], False), ([True, False], True), ([False, True], False)],
    ids=["returned", "raised", "raised-then-returned", "returned-then-raised"],
)
def test_a_fit_whose_loop_ended_in_its_last_attempt_is_told_apart(tmp_path, attempts, ended):
    from ray_ormas._internal.record.reader import RunRecords
    from ray_ormas._internal.tracking.sync import close_unended, loop_ended

    for attempt, raised in enumerate(attempts):
        a_segment(tmp_path, "fit-a", attempt, loop_raised=raised)
    records = RunRecords(RecordStore.at(str(tmp_path)))
    last = records.segments()[-1]
    assert last.complete and (last.error is None) == (not attempts[-1])
    assert loop_ended(records, "fit-a") is ended and loop_ended(records, "another fit") is False
    journal = TrackingJournal.model_validate(json.loads(WRITTEN_BEFORE.read_text()) | {"status": None})
    close_unended(journal, "KILLED", loop_ended=ended)
    # A loop that ended is FINISHED whatever --close-as says; else --close-as, with an error that says so.
    assert journal.status == ("FINISHED" if ended else "KILLED")
    assert (journal.error is None) == ended and journal.closed_by.startswith("ray-ormas mlflow-sync")
