"""What the restructuring made explicit, each tested without a Ray cluster: the names the record's
layout reserves, the monitor handle a loop holds, a rank whose fleet facts cannot be read, and a
checkpoint whose metadata cannot be read."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import ray_ormas
from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.head.fleet_head import FleetHead, FleetSpec
from ray_ormas._internal.record.layout import RESERVED_MONITOR_NAMES, check_monitor_name
from ray_ormas._internal.record.segments import record_pointer
from ray_ormas._internal.record.store import RecordStore
from ray_ormas._internal.worker.session import WorkerSession


@pytest.mark.parametrize("name", sorted(RESERVED_MONITOR_NAMES))
def test_a_name_the_layout_reserves_is_refused_and_never_taken_by_an_auto_named_monitor(name):
    with pytest.raises(ValueError, match=f"monitor name '{name}' is reserved"):
        check_monitor_name(name)
    session = SimpleNamespace(monitors={})
    assert WorkerSession.free_name(session, name) == f"{name}-2"  # a model class `Fleet`
    assert WorkerSession.free_name(session, "generator") == "generator"


def test_the_monitor_handle_shows_what_a_loop_calls_and_no_more():
    public = sorted(n for n in dir(ray_ormas.WorkerMonitor) if not n.startswith("_"))
    assert public == ["close", "micro_step", "monitor", "name", "step", "steps"]


def test_a_rank_whose_facts_cannot_be_read_is_named_in_the_fleet_record_and_summary(tmp_path, caplog):
    store = RecordStore.at(str(tmp_path / "ormas"))
    head = FleetHead(FleetSpec(FleetSettings(ray_metrics=False), store, "fit", "run", 2, "ddp"))
    with caplog.at_level(logging.WARNING, logger="ray_ormas.fleet"):
        head.unreadable(0, 1, 3, "RuntimeError: CUDA error")
    summary = head.finish()
    [alarm] = summary.alarms
    assert alarm["kind"] == "unreadable" and alarm["ranks"] == [1] and alarm["check"] == 3
    assert "rank 1 could not read its fleet facts" in alarm["message"] and "CUDA error" in alarm["message"]
    said = [r.getMessage() for r in caplog.records if "could not read its fleet facts" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("[ray-ormas] fleet unreadable: rank 1")


class _Unreadable:
    path = "/runs/r/checkpoint_000001"

    def get_metadata(self):
        raise ValueError("Expecting value: line 1 column 1 (char 0)")


def test_unreadable_checkpoint_metadata_is_said_and_read_as_no_pointer(caplog):
    with caplog.at_level(logging.WARNING, logger="ray_ormas.record"):
        assert record_pointer(_Unreadable()) is None
    [said] = [r.getMessage() for r in caplog.records]
    assert "could not read the metadata of checkpoint /runs/r/checkpoint_000001" in said and "Expecting value" in said
    readable = SimpleNamespace(get_metadata=lambda: {"ormas": {"model": {"segment": "segment-000"}}})
    assert record_pointer(readable) == {"model": {"segment": "segment-000"}}
