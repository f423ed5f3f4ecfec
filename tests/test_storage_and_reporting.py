"""Record placement (segments never overwrite) and what a report carries, without Ray workers."""
from __future__ import annotations

import copy

import pyarrow.fs
import torch
from ray.train import RunConfig

from ray_ormas.demo import DigitsCNN
from ray_ormas.reporting import EVENT_LIMIT, RecordBuffer, parameter_digest, rank0_metrics
from ray_ormas.storage import claim_segment, default_record_root, is_local_storage, segments


def test_segments_are_claimed_in_order_and_never_reused(tmp_path):
    a = claim_segment(tmp_path / "model")
    (a / "diary.jsonl").write_text("x")
    b = claim_segment(tmp_path / "model")
    assert (a.name, b.name) == ("segment-000", "segment-001")
    assert (a / "diary.jsonl").read_text() == "x"
    assert segments(tmp_path / "model") == [a, b]
    assert segments(tmp_path / "absent") == []


def test_record_root_follows_local_run_storage_only(tmp_path):
    local = RunConfig(name="r1", storage_path=str(tmp_path))
    assert is_local_storage(local) and default_record_root(local) == str(tmp_path / "r1" / "ormas")
    remote = RunConfig(name="r1", storage_path="s3://bucket/runs")
    assert not is_local_storage(remote)
    assert default_record_root(remote).endswith("ray_results/ray_ormas/r1")
    custom = RunConfig(name="r1", storage_path="bucket/runs", storage_filesystem=pyarrow.fs.LocalFileSystem())
    assert not is_local_storage(custom)


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
    with torch.no_grad():                     # a permutation keeps the plain sum: the weighted one sees it
        c.conv1[0].weight.data = c.conv1[0].weight.data.flip(0)
    assert parameter_digest(a) != parameter_digest(c)


def test_record_buffer_keeps_latest_row_and_bounded_events():
    buf = RecordBuffer()
    buf("event", {"event": "run_start", "seq": 0})
    buf("metrics", {"step": 0, "loss": 2.0, "grad": {}, "stuck": {"conv2": [32, 0, 0, 0], "conv3": [0, 0, 0, 0]}})
    buf("event", {"event": "certificate", "seq": 1, "step": 0, "layer": "conv2", "severity": "proof", "count": 32,
                  "statement": "long text not carried"})
    for i in range(EVENT_LIMIT + 5):
        buf("event", {"event": "alarm", "seq": 2 + i, "step": i})
    m = rank0_metrics("ormas/", buf, {"alarms": 3, "repairs": 0})
    assert m["ormas/loss"] == 2.0 and m["ormas/check_step"] == 0
    assert m["ormas/stuck_channels"] == 32 and m["ormas/stuck_layers"] == 1
    assert m["ormas/certificates"] == 1 and m["ormas/alarms"] == 3
    assert len(m["ormas/events"]) == EVENT_LIMIT and m["ormas/events_dropped"] == 6
    assert m["ormas/events"][0] == {"seq": 1, "event": "certificate", "step": 0, "layer": "conv2",
                                    "severity": "proof", "count": 32}
    again = rank0_metrics("ormas/", buf, {})
    assert again["ormas/events"] == [] and again["ormas/events_dropped"] == 0
