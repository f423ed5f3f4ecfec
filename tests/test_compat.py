"""The seam with ormas-monitor (ray_ormas/_internal/seams/ormas.py): each piece works with the installed
ormas-monitor and fails loudly, saying what to do, against one that behaves differently. The
"different" ormas-monitors are subclasses of the real classes with one thing changed, the way a
release would change it. No Ray."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from ormas_monitor import Monitor
from packaging.requirements import Requirement

from ray_ormas._internal.seams import ormas as compat
from ray_ormas._internal.seams.ormas import (
    GLOBAL_NORMS_NOTE,
    OWN_FSDP_NOTE,
    LossTap,
    MetricNaming,
    OrmasCompatError,
    ShardedGradientMonitor,
    check_metrics_file,
    check_sharded_gradient_seam,
    flush_metrics,
)
from ray_ormas._internal.worker.micro_steps import MicroStepLosses

ROOT = Path(__file__).resolve().parents[1]


def small_monitor(tmp_path: Path, cls: type = Monitor, steps: int = 4) -> Monitor:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mon = cls(net, opt, out=tmp_path / "record", check_every=2, verbose=False)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for _ in range(steps):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    return mon


# ------------------------------------------------------------------ no private imports, a tight pin
def test_the_package_imports_no_private_ormas_monitor_module_and_sets_no_private_attribute():
    seam = ROOT / "ray_ormas" / "_internal" / "seams" / "ormas.py"
    assert seam.is_file()
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ormas_monitor"):
                parts = node.module.split(".") + [a.name for a in node.names]
                assert not any(p.startswith("_") for p in parts), f"{path.name}:{node.lineno} imports {parts}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("ormas_monitor"):
                        assert not any(p.startswith("_") for p in alias.name.split(".")), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Assign) and path != seam:
                for target in node.targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr.startswith("_")
                        and isinstance(target.value, ast.Attribute)
                        and target.value.attr in ("monitor", "_sink")
                    ):
                        raise AssertionError(f"{path.name}:{node.lineno} sets {target.attr} on an ormas object")
    # Only the seam reads ormas-monitor's private attributes.
    for path in sorted((ROOT / "ray_ormas").rglob("*.py")):
        if path != seam:
            assert not re.search(r"monitor\._[a-z]", path.read_text()), path.name


def test_the_dependency_range_admits_only_the_ormas_monitor_ci_tests():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [spec] = [Requirement(d) for d in project["dependencies"] if d.startswith("ormas-monitor")]
    pinned = re.search(r"^ormas-monitor==(\S+)$", (ROOT / "constraints" / "ci.txt").read_text(), re.M).group(1)
    assert compat.PINNED == f"ormas-monitor=={pinned}"
    assert spec.specifier.contains(pinned)
    for later in ("0.2.4", "0.3.0", "1.0.0"):
        assert not spec.specifier.contains(later), later


# ------------------------------------------------------------------ metric naming
def test_metric_names_come_from_ormas_monitor_and_a_changed_naming_fails_loudly(monkeypatch):
    import ormas_monitor.integrations.sinks as sinks

    naming = MetricNaming("ormas")
    row = {"step": 30, "loss": 0.25, "grad": {"conv1": 1.5}, "stuck": {"conv1": [2, 1, 0, 0]}}
    assert sorted(naming.entries("metrics", row)) == [
        ("ormas/grad_norm/conv1", 1.5, 30),
        ("ormas/loss", 0.25, 30),
        ("ormas/stuck_channels/conv1", 3.0, 30),
        ("ormas/stuck_channels_total", 3.0, 30),
    ]
    assert naming.entries("event", {"event": "repair", "step": 31}) == [("ormas/events/repair", 1.0, 31)]

    class Reworded(sinks.TensorBoardSink):  # a release that names rows differently
        def __call__(self, kind, payload):
            self.writer.add_scalar("ormas/training_loss", 0.5, 7)

    monkeypatch.setattr(sinks, "TensorBoardSink", Reworded)
    with pytest.raises(
        OrmasCompatError,
        match=r"a probe row was named .*pip install 'ormas-monitor==0.2.3'.*"
        r"mlflow=False",
    ):
        MetricNaming("ormas")


# ------------------------------------------------------------------ the metrics file
def test_the_metrics_file_is_flushed_mid_run_and_a_renamed_file_fails_loudly(tmp_path):
    mon = small_monitor(tmp_path)
    check_metrics_file(mon)
    assert (tmp_path / "record" / "metrics.jsonl").read_text() == ""  # ormas buffers the rows ...
    assert flush_metrics(mon)
    rows = (tmp_path / "record" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2  # ... the flush writes them
    mon.close(report=False)
    assert not flush_metrics(mon)

    class Renamed(Monitor):  # a release that renamed the attribute
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._rows = self.__dict__.pop("_metrics")

    renamed = small_monitor(tmp_path / "renamed", Renamed, steps=0)
    with pytest.raises(
        OrmasCompatError,
        match=r"Monitor._metrics is None, not the open metrics.jsonl.*"
        r"pip install 'ormas-monitor==0.2.3'",
    ):
        check_metrics_file(renamed)
    renamed._metrics = renamed._rows
    renamed.close(report=False)


# ------------------------------------------------------------------ FSDP2 gradient norms
def test_the_fsdp2_seam_matches_this_ormas_monitor_and_a_changed_method_fails_loudly():
    check_sharded_gradient_seam()

    class NewSignature(Monitor):  # a release whose gradient read takes more
        def _read_scalars(self, loss, scale=None):
            return super()._read_scalars(loss)

    with pytest.raises(
        OrmasCompatError,
        match=r"Monitor._read_scalars takes \['self', 'loss', 'scale'\].*"
        r"strategy='ddp'",
    ):
        check_sharded_gradient_seam(NewSignature)

    class Gone(Monitor):
        _scale_state = None

    with pytest.raises(OrmasCompatError, match=r"Monitor._scale_state takes None"):
        check_sharded_gradient_seam(Gone)


def test_the_fsdp2_manifest_replaces_ormas_monitors_note_and_a_reworded_note_fails_loudly(tmp_path):
    mon = small_monitor(tmp_path, ShardedGradientMonitor)
    assert GLOBAL_NORMS_NOTE in mon._manifest()["notes"]
    mon.dist_mode = "fsdp"  # as ormas-monitor sets it under FSDP: its note is replaced
    notes = mon._manifest()["notes"]
    assert GLOBAL_NORMS_NOTE in notes and OWN_FSDP_NOTE not in notes

    class Reworded(ShardedGradientMonitor):
        def _manifest(self):
            original = Monitor._manifest

            def reworded(monitor):
                out = original(monitor)
                return {**out, "notes": [n.replace("own shards", "local shards") for n in out["notes"]]}

            Monitor._manifest = reworded
            try:
                return super()._manifest()
            finally:
                Monitor._manifest = original

    reworded = small_monitor(tmp_path / "reworded", Reworded)
    reworded.dist_mode = "fsdp"
    with pytest.raises(OrmasCompatError, match="the manifest's notes are"):
        reworded._manifest()
    mon.close(report=False)
    reworded.close(report=False)


# ------------------------------------------------------------------ micro-step losses (ray-ormas's own)
def test_micro_step_losses_are_averaged_on_the_device_and_keep_the_graph_when_asked():
    window = MicroStepLosses()
    assert window.take_mean() is None  # nothing seen is not zero
    w = torch.tensor(2.0, requires_grad=True)
    for value in (1.0, 2.0, torch.tensor([3.0, 5.0])):  # an unreduced loss counts as its mean
        window.add(w * value if isinstance(value, float) else value)
    mean = window.take_mean()
    assert mean.item() == pytest.approx((2.0 + 4.0 + 4.0) / 3) and mean.grad_fn is None
    last = w * 3.0
    window.add(last)
    attached = window.take_mean(keep_graph=True)
    assert attached.item() == 6.0  # the attachment adds exactly zero ...

    def reachable(fn, seen=None):
        seen = set() if seen is None else seen
        if fn is not None and fn not in seen:
            seen.add(fn)
            for child, _ in fn.next_functions:
                reachable(child, seen)
        return seen

    assert last.grad_fn in reachable(attached.grad_fn)  # ... and the last loss's graph is reachable
    assert window.take_mean() is None
    window.add(last)  # one micro-batch: its loss as it is, no device op
    assert window.take_mean() is last and window.take_mean() is None


# ------------------------------------------------------------------ the loss a callback hands its monitor
def test_the_loss_tap_keeps_the_loss_handed_to_the_monitor_and_a_changed_monitor_fails_loudly(tmp_path):

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    monitor = Monitor(model, out=str(tmp_path / "run"), verbose=False)
    tap = LossTap(monitor)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    monitor.note_loss(loss)  # as ormas-monitor's Transformers callback does
    monitor.step()
    assert tap.take() is loss and tap.take() is None  # once
    monitor.step(loss.detach() * 2)
    assert float(tap.take()) == float(loss.detach()) * 2
    assert monitor.step_count == 2
    monitor.close()

    class Renamed(Monitor):  # a release whose note_loss takes the loss under another name
        def note_loss(self, value):  # type: ignore[override]
            super().note_loss(value)

    with pytest.raises(OrmasCompatError, match="Monitor.note_loss takes no `loss`"):
        LossTap(Renamed.__new__(Renamed))
