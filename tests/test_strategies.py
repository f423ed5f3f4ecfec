"""Every way people train under Ray, with the monitor: FSDP2, mixed precision, a GAN with two
monitors, batch semantics, the epoch helper, SyncBatchNorm. Ray tests run on the session's real
local cluster (gloo, CPU); the rest need no workers. Gradient accumulation under DDP is checked on
the other job beside the evicting fit (tests/test_node_loss.py, tests/scenarios/bystander.py):
that fit is shared."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from ormas_monitor import Monitor, MonitorConfig
from ormas_monitor.record import verify_run
from ray.train import RunConfig, ScalingConfig
from torch.utils.data import DistributedSampler, TensorDataset

import ray_ormas
from ray_ormas import BatchSize, RayOrmasTrainer
from ray_ormas._internal.seams.ormas import GLOBAL_NORMS_NOTE
from ray_ormas.demo import DigitsCNN, lesion, load_digits

from . import loops


def diary(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "diary.jsonl").read_text().splitlines()]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def fit(storage: Path, name: str, loop, workers: int = 2, **kwargs):
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("mlflow", False)
    return RayOrmasTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=str(storage)),
        **kwargs,
    ).fit()


# ---------------------------------------------------------------- Ray: strategies end to end
SHARDINGS = {"children": None, "layers": {"shard_modules": "encoder.layers.?"}}


@pytest.fixture(scope="module")
def fsdp_fit(ray_cluster, tmp_path_factory):
    """One FSDP2 fit with a model per way of sharding (FSDP2's default, one unit per child; one per
    encoder layer), each with its monitor: the gradient norms probed, the losses exploding from
    step 9, then each trained model's checkpoint round (tests/loops.py)."""
    return fit(
        tmp_path_factory.mktemp("fsdp"),
        "fsdp",
        loops.fsdp_transformer_loop,
        strategy="fsdp",
        monitor_config=MonitorConfig(check_every=1, warmup=3),
        train_loop_config={"steps": 12, "probe_step": 6, "explode_at": 9, "shardings": SHARDINGS},
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_fsdp2_on_cpu_records_true_global_gradient_norms(fsdp_fit, sharding):
    result = fsdp_fit
    out = result.return_value[sharding]
    assert out["dtensor_params"] and out["monitor_class"] == "ShardedGradientMonitor"
    record = Path(result.ormas.records[sharding])
    assert verify_run(record).ok
    manifest = next(e for e in diary(record) if e["event"] == "manifest")
    assert manifest["distributed"]["mode"] == "fsdp" and manifest["channel_checks"] is False
    assert GLOBAL_NORMS_NOTE in manifest["notes"]
    assert [r["step"] for r in rows(record)] == list(range(12))
    probe = next(r for r in rows(record) if r["step"] == 6)
    assert probe["stuck"] == {}  # no channel scans under FSDP
    assert set(probe["grad"]) == set(out["reference"]) and len(probe["grad"]) >= 10
    for layer, norm in probe["grad"].items():  # the full gradients' norms, not a shard's
        assert math.isclose(norm, out["reference"][layer], rel_tol=1e-5), layer
    prefix = "ormas/" if sharding == "children" else f"ormas/{sharding}/"  # the first monitor is the main one
    digests = result.ormas.digests(prefix + "param_digest")[-1]
    assert len(set(digests)) == 2  # each rank digests its own shards
    alarms = [e for e in diary(record) if e["event"] == "alarm"]
    assert alarms and {e["diagnosis"] for e in alarms} == {"exploding"} and min(e["step"] for e in alarms) >= 9


@pytest.mark.timeout(240)
def test_ddp_gradient_alarms_fire_when_gradients_explode(busy_fit):
    # The shared busy fit (tests/shared_fits.py): the loss times 10^4 from step 150 of 200.
    result = busy_fit.result
    alarms = [e for e in diary(result.ormas.record_dir) if e["event"] == "alarm"]
    assert alarms and {e["diagnosis"] for e in alarms} == {"exploding"} and min(e["step"] for e in alarms) >= 150
    assert result.ormas.final["ormas/alarms"] == len(alarms)


@pytest.mark.usefixtures("ray_cluster")  # local mode still starts Ray when none is running
@pytest.mark.timeout(240)
def test_mixed_precision_skipped_steps_are_not_alarms(storage):
    # What the scaler skips is the same on every rank: Ray Train's local mode (the loop in this
    # process, no worker group) is what it needs.
    result = fit(
        storage, "amp", loops.amp_loop, workers=0, check_every=1, train_loop_config={"steps": 12, "overflow_at": 7}
    )
    assert result.return_value["dtypes"] == ["torch.bfloat16"]
    scales = result.return_value["scales"]
    assert scales[7] == scales[6] / 2  # the scaler skipped step 7
    events = diary(result.ormas.record_dir)
    skipped = [e for e in events if e["event"] == "skipped_step"]
    assert [e["step"] for e in skipped] == [7]
    assert not [e for e in events if e["event"] in ("alarm", "nonfinite_gradient")]
    assert result.ormas.final["ormas/skipped_steps"] == 1 and result.ormas.final["ormas/alarms"] == 0
    manifest = next(e for e in events if e["event"] == "manifest")
    assert manifest["precision"]["scaler"] is True and manifest["precision"]["scaler_enabled"] is True


@pytest.mark.usefixtures("ray_cluster")  # local mode still starts Ray when none is running
@pytest.mark.timeout(240)
def test_a_gan_gets_one_monitor_and_one_record_per_model(storage):
    # One monitor and one record per model is the same on every rank: Ray Train's local mode. The
    # GAN under DDP on 2 workers is docs/cli.md's `examples/gan.yaml` job (tests/test_doc_commands.py:
    # a monitor and a verified DDP record per model).
    result = fit(storage, "gan", loops.gan_loop, workers=0, check_every=3, train_loop_config={"steps": 12})
    assert result.return_value == {"generator_steps": 12, "discriminator_steps": 12}
    run = result.ormas
    assert set(run.records) == {"generator", "discriminator"}
    for name, path in run.records.items():
        record = Path(path)
        assert record.parent.name == name and record.name == "segment-000" and verify_run(record).ok
        start, end = diary(record)[0], diary(record)[-1]
        assert start["name"] == f"gan/{name}" and end["steps"] == 12
    final = run.final
    assert final["ormas/checks"] == 4 and final["ormas/discriminator/checks"] == 4  # the first monitor's: ormas/
    assert json.loads((Path(run.records["generator"]) / "segment.json").read_text())["monitor"] == "generator"


@pytest.mark.timeout(240)
def test_epoch_helper_reshuffles_every_epoch_and_the_global_batch_is_split(worker_view_fit):
    result = worker_view_fit.result  # a global batch of 48 on 2 workers (tests/shared_fits.py)
    out = result.return_value
    assert out["batch_size"] == 24 and all(len(b) == 24 for b in out["first_batches"])
    assert len({tuple(b) for b in out["first_batches"]}) == 3  # set_epoch: a new order each epoch
    assert result.ormas.final["ormas/effective_batch"] == 48


# ---------------------------------------------------------------- no workers needed
def test_a_global_batch_that_does_not_split_is_refused_on_the_driver():
    with pytest.raises(
        ValueError,
        match=r"a global batch of 100 does not split evenly over 3 workers x 2 "
        r"accumulation steps \(6 micro-batches per optimizer step\): use a "
        r"multiple of 6, e.g. 96 or 102",
    ):
        RayOrmasTrainer(
            lambda: None,
            batch=BatchSize(100, per="global", accumulation=2),
            scaling_config=ScalingConfig(num_workers=3),
        )
    assert BatchSize(32).effective(4) == 128 and BatchSize(32, accumulation=2).per_rank(4) == 32
    for bad, words in [
        ({"size": 0}, "size: Input should be greater than or equal to 1"),
        ({"size": 8, "per": "node"}, "'rank' or 'global'"),
        ({"size": 8, "accumulation": 0}, "accumulation: Input should be greater than or equal to 1"),
    ]:
        with pytest.raises(ValueError, match=words):
            BatchSize(**bad)
    with pytest.raises(TypeError, match="batch must be a ray_ormas.BatchSize"):
        RayOrmasTrainer(lambda: None, batch=64)


def test_sync_batchnorm_needs_ddp_on_gpus_and_is_refused_on_the_driver_otherwise():
    with pytest.raises(ValueError, match="sync_batchnorm=True needs GPU workers"):
        RayOrmasTrainer(lambda: None, sync_batchnorm=True)
    with pytest.raises(ValueError, match="sync_batchnorm=True applies to strategy='ddp'"):
        RayOrmasTrainer(
            lambda: None,
            sync_batchnorm=True,
            strategy="fsdp",
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        )


def test_the_monitor_pairs_and_certifies_syncbatchnorm_like_batchnorm(tmp_path):
    """What runs on CPU: the conversion, and the monitor treating SyncBatchNorm as BatchNorm
    (producer -> BN pairs, certificates for the lesioned layers). The DDP run on GPUs is in
    tests/gpu/check_gpu.py."""
    torch.manual_seed(0)
    net = nn.SyncBatchNorm.convert_sync_batchnorm(DigitsCNN())
    lesion(net)
    assert type(net.conv2[1]) is nn.SyncBatchNorm
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    mon = Monitor(net, opt, out=tmp_path / "sbn", verbose=False, config=MonitorConfig(check_every=1, patience=3))
    x, y, _, _ = load_digits(0)
    for step in range(12):
        loss = F.cross_entropy(net(x[step * 32 : (step + 1) * 32]), y[step * 32 : (step + 1) * 32])
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    mon.close()
    assert mon.pairs == {"conv1.0": "conv1.1", "conv2.0": "conv2.1", "conv3.0": "conv3.1"}
    certified = {e["layer"] for e in diary(tmp_path / "sbn") if e["event"] == "certificate"}
    assert certified == {"conv2.0", "conv3.0"}


def test_epochs_calls_set_epoch(caplog):
    sampler = DistributedSampler(TensorDataset(torch.arange(10)), num_replicas=2, rank=0, shuffle=True, seed=0)
    seen = []
    for epoch in ray_ormas.epochs(torch.utils.data.DataLoader(sampler.dataset, sampler=sampler), 3, start=1):
        seen.append((epoch, sampler.epoch))
    assert seen == [(1, 1), (2, 2)]
    assert list(ray_ormas.epochs([1, 2], 2)) == [0, 1]  # one process, no sampler: nothing to set or say
    assert not [r for r in caplog.records if r.name.startswith("ray_ormas")]
    with pytest.raises(ValueError, match="count must be an int >= 0"):
        list(ray_ormas.epochs(sampler, -1))


def _epochs_on_rank(rank: int, init_file: str, said) -> None:
    """One of two gloo ranks: epochs() over a loader whose sampler has no set_epoch()."""
    import logging

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ray_ormas").addHandler(handler)
    loader = torch.utils.data.DataLoader(TensorDataset(torch.arange(10)), shuffle=True)
    assert list(ray_ormas.epochs(loader, 2)) == [0, 1]
    said.put([(r.name, r.levelname, r.getMessage()) for r in records])
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_epochs_says_once_per_rank_when_several_ranks_share_a_sampler_without_set_epoch(tmp_path):
    import torch.multiprocessing as mp

    said = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_epochs_on_rank, args=(str(tmp_path / "init"), said), nprocs=2)
    for _ in range(2):
        [(name, level, message)] = said.get()
        assert name == "ray_ormas.strategies" and level == "WARNING"
        assert message.startswith(
            "[ray-ormas] epochs(): RandomSampler has no set_epoch(); if it shuffles, every "
            "epoch sees the same order. Use a DistributedSampler"
        )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_fsdp2_checkpoints_save_full_state_and_restore_identically_on_every_rank(fsdp_fit, sharding):
    out = fsdp_fit.return_value[sharding]["checkpoint"]  # saved after the fit's 12 steps
    assert out["step"] == 12 and out["same_params"] and out["same_optimizer"] and out["same_after_training"]
    assert out["saved_keys"] == ["embed.weight", "encoder.layers.0.linear1.bias", "encoder.layers.0.linear1.weight"]
