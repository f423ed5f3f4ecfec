"""Record placement (segments never overwrite), storage checks and what a report carries, without Ray workers."""

from __future__ import annotations

import copy
import json

import fsspec
import pyarrow.fs as pafs
import pytest
import torch
from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem, SubTreeFileSystem
from ray.train import RunConfig

from ray_ormas import RayOrmasTrainer
from ray_ormas._internal.fleet.digest import parameter_digest
from ray_ormas._internal.record.segments import diary_tail
from ray_ormas._internal.record.store import RecordStorageError, RecordStore
from ray_ormas._internal.worker.reporting import RecordBuffer, rank0_metrics
from ray_ormas.demo import DigitsCNN


def test_local_segments_are_claimed_in_order_and_never_reused(tmp_path):
    store = RecordStore.at(tmp_path / "ormas")
    path_a, a = store.claim_segment("model", {"attempt": 0})
    (a / "diary.jsonl").write_text("x")
    path_b, b = store.claim_segment("model", {"attempt": 1})
    assert (a.name, b.name) == ("segment-000", "segment-001") and str(a) == path_a and str(b) == path_b
    assert (a / "diary.jsonl").read_text() == "x"
    assert json.loads((b / "segment.json").read_text()) == {"attempt": 1, "segment": 1}
    assert store.segments("model") == [path_a, path_b] and store.monitors() == ["model"]
    assert store.segments("absent") == []


@pytest.mark.parametrize(
    "make_fs",
    [
        lambda root: SubTreeFileSystem(str(root), LocalFileSystem()),
        lambda root: SubTreeFileSystem(str(root), PyFileSystem(FSSpecHandler(fsspec.filesystem("file")))),
    ],
    ids=["subtree", "fsspec"],
)
def test_remote_store_stages_locally_and_uploads(tmp_path, make_fs, staging_in_tmp_path):
    remote = tmp_path / "bucket"
    remote.mkdir()
    store = RecordStore(make_fs(remote), "runs/r1/ormas")
    assert not store.is_local
    store.check_writable()
    path, local = store.claim_segment("model", {"attempt": 0})
    assert path == "runs/r1/ormas/model/segment-000" and local.parent == staging_in_tmp_path
    assert json.loads((remote / path / "segment.json").read_text())["segment"] == 0  # the claim itself
    (local / "diary.jsonl").write_text("line\n")
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=store.filesystem)
    assert (remote / path / "diary.jsonl").read_text() == "line\n"
    assert store.claim_segment("model", {})[0].endswith("segment-001")
    back = store.download(path, tmp_path / "back")
    assert sorted(p.name for p in back.iterdir()) == ["diary.jsonl", "segment.json"]


def test_record_store_follows_the_run_storage(tmp_path):
    local = RecordStore.for_run(RunConfig(name="r1", storage_path=str(tmp_path)))
    assert local.is_local and local.root == str(tmp_path / "r1" / "ormas")
    assert RecordStore.for_run(RunConfig(name="r1", storage_path=f"file://{tmp_path}")).root == local.root
    mock = RecordStore.for_run(RunConfig(name="r1", storage_path="mock:///bucket/runs"))
    assert not mock.is_local and mock.root == "bucket/runs/r1/ormas"
    custom_fs = SubTreeFileSystem(str(tmp_path), LocalFileSystem())
    custom = RecordStore.for_run(RunConfig(name="r1", storage_path="bucket/runs", storage_filesystem=custom_fs))
    assert custom.filesystem is custom_fs and custom.root == "bucket/runs/r1/ormas"
    assert RecordStore.for_run(RunConfig(name="r1"), record_dir=tmp_path / "mine").root == str(tmp_path / "mine")
    with pytest.raises(RecordStorageError, match="pyarrow cannot open the storage URI 'nosuch://x'"):
        RecordStore.at("nosuch://x")


def test_unwritable_storage_fails_on_the_driver_naming_path_and_reason(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(RecordStorageError) as e:  # a folder that cannot be made: the write probe says why
        RayOrmasTrainer(lambda: None, run_config=RunConfig(name="r1", storage_path="/proc/ray-ormas-runs"))
    assert "cannot write the ormas record to /proc/ray-ormas-runs/r1/ormas" in str(e.value)
    assert "storage_path" in str(e.value)
    with pytest.raises(RecordStorageError, match=f"storage_path=...\\): '{blocker}/runs': {blocker} is a file"):
        RayOrmasTrainer(lambda: None, run_config=RunConfig(name="r1", storage_path=str(blocker / "runs")))
    with pytest.raises(RecordStorageError, match="record_dir: .* is a file, not a folder"):
        RayOrmasTrainer(lambda: None, record_dir=blocker)
    assert blocker.read_text() == "not a folder" and list(tmp_path.iterdir()) == [blocker]


def test_diary_tail_ignores_a_line_cut_short():
    lines = [{"seq": 0, "event": "run_start", "hash": "a" * 64}, {"seq": 1, "event": "alarm", "hash": "b" * 64}]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    assert diary_tail(data) == {"events": 2, "last_hash": "b" * 64, "complete": False, "error": None}
    assert diary_tail(data + b'{"seq": 2, "event": "run_end", "ha') == diary_tail(data)
    ended = data + json.dumps({"seq": 2, "event": "run_end", "hash": "c" * 64}).encode()
    assert diary_tail(ended) == {"events": 3, "last_hash": "c" * 64, "complete": True, "error": None}
    raised = data + json.dumps({"seq": 2, "event": "run_end", "hash": "c" * 64, "error": "ValueError: x"}).encode()
    assert diary_tail(raised) == {"events": 3, "last_hash": "c" * 64, "complete": True, "error": "ValueError: x"}
    assert diary_tail(None) == {"events": 0, "last_hash": None, "complete": False, "error": None}


def test_parameter_digest_sees_a_single_bit():
    torch.manual_seed(0)
    a = DigitsCNN()
    b = copy.deepcopy(a)
    assert parameter_digest(a) == parameter_digest(b)
    with torch.no_grad():
        w = b.conv2[0].weight
        w[3, 1, 0, 0] = torch.nextafter(w[3, 1, 0, 0], torch.tensor(1.0))
    assert parameter_digest(a) != parameter_digest(b)
    c = copy.deepcopy(a)
    with torch.no_grad():  # a permutation keeps the plain sum: the weighted one sees it
        c.conv1[0].weight.data = c.conv1[0].weight.data.flip(0)
    assert parameter_digest(a) != parameter_digest(c)


def test_record_buffer_keeps_latest_row_and_counts_events():
    buf = RecordBuffer()
    buf("event", {"event": "run_start", "seq": 0})
    buf("metrics", {"step": 0, "loss": 2.0, "grad": {}, "stuck": {"conv2": [32, 0, 0, 0], "conv3": [0, 0, 0, 0]}})
    buf("event", {"event": "certificate", "seq": 1, "step": 0, "layer": "conv2", "severity": "proof", "count": 32})
    for i in range(205):
        buf("event", {"event": "alarm", "seq": 2 + i, "step": i})
    m = rank0_metrics("ormas/", buf, {"alarms": 3, "repairs": 0})
    assert m["ormas/loss"] == 2.0 and m["ormas/check_step"] == 0
    assert m["ormas/stuck_channels"] == 32 and m["ormas/stuck_layers"] == 1
    assert m["ormas/certificates"] == 1 and m["ormas/alarms"] == 3
    assert m["ormas/new_events"] == 206  # run_start is not counted; the events are in the record
    assert all(isinstance(v, (int, float, str, type(None))) for v in m.values())  # numbers, not lists
    assert len(repr(m)) < 400
    again = rank0_metrics("ormas/", buf, {})
    assert again["ormas/new_events"] == 0
