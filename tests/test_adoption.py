"""Zero-change adoption on a real local Ray cluster (gloo, CPU): an unchanged Ray Train loop, a
Lightning module through `ray.train.lightning`, and a Transformers `Trainer` through
`ray.train.huggingface.transformers`, each under RayOrmasTrainer with no other change.

The loops are written out here the way Ray Train's docs write them. Two things differ, because
nothing may download: the data are scikit-learn's bundled digits, and the models are the digits
CNN (two of its layers zeroed: a lesion to certify and repair) and a tiny BERT built from a config.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray.train
import ray.train.torch
import torch
from mlflow import MlflowClient
from ormas_monitor.record import verify_run
from ray.train import RunConfig, ScalingConfig
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import ray_ormas
from ray_ormas import RayOrmasTrainer
from ray_ormas.demo import DigitsCNN, lesion, load_digits

from .loops import nan_on_rank

pytestmark = pytest.mark.usefixtures("ray_cluster")


def diary(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "diary.jsonl").read_text().splitlines()]


def events(path: Path, kind: str) -> list[dict]:
    return [e for e in diary(path) if e["event"] == kind]


def metric_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def lesioned_cnn() -> DigitsCNN:
    torch.manual_seed(0)
    net = DigitsCNN()
    lesion(net)
    return net


def digits_dataset() -> TensorDataset:
    x, y, _, _ = load_digits(0)
    return TensorDataset(x, y)


# Ray Train's PyTorch quickstart (docs: "Get Started with Distributed Training using PyTorch"),
# unchanged but for the model and the data (resnet18 and FashionMNIST there).
def train_func():
    # Model, Loss, Optimizer
    model = lesioned_cnn()
    # model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    # [1] Prepare model.
    model = ray.train.torch.prepare_model(model)
    # model.to("cuda")  # This is done by `prepare_model`
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    train_data = digits_dataset()
    train_loader = DataLoader(train_data, batch_size=64, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(3):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)

        for images, labels in train_loader:
            # This is done by `prepare_data_loader`!
            # images, labels = images.to("cuda"), labels.to("cuda")
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # [3] Report metrics and checkpoint.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if ray.train.get_context().get_world_rank() == 0:
            print(metrics)


def per_epoch() -> int:
    """Optimizer steps per epoch: the digits' training split over 2 ranks, batches of 64."""
    return math.ceil(math.ceil(len(digits_dataset()) / 2) / 64)


def last_check(steps: int, check_every: int = 2) -> int:
    """The monitor's last check of a fit whose monitor steps `steps` times (steps 0 .. steps-1)."""
    return (steps - 1) // check_every * check_every


def train_func_nan_on_rank_1(config):
    """The quickstart, unchanged, with rank 1's loss NaN at the loop's forward `config["nan_at"]`
    (the monitor's step `nan_at - 1`: the optimizer step hook attaches it at the loop's first step)."""
    nan_on_rank(1, "DigitsCNN", at_forward=config["nan_at"])
    train_func()


def check_the_fleet_names_rank_1s_nan(alarms: list[dict], run: str | Path, step: int) -> dict:
    """The fleet had every rank's own loss at every check before the NaN, and its first alarm
    (of `alarms`, a fit's) names rank 1, whose loss was NaN at `step` (under DDP the NaN then
    reaches every rank); `run` is the fit's run folder. Returns that alarm."""
    alarm = next(a for a in alarms if a["kind"] == "nonfinite")
    assert alarm["ranks"] == [1] and alarm["step"] == step and alarm["source"] == "loss", alarm
    checks = ray_ormas.open_records(run).fleet_checks().to_pylist()
    before = [r for r in checks if r["step"] < step]
    assert before and all(isinstance(r["loss"], float) and math.isfinite(r["loss"]) for r in before), before
    by_check: dict = {}
    for r in before:
        by_check.setdefault(r["check"], {})[r["rank"]] = r["loss"]
    # Each rank's own: the ranks train on different shards, so their losses differ at every check.
    assert all(len(losses) == 2 and losses[0] != losses[1] for losses in by_check.values()), by_check
    return alarm


def adopted_fit(loop, storage: Path, name: str, nan_at: int, **kwargs):
    """`loop` unchanged under RayOrmasTrainer on 2 workers, a check every 2 steps, rank 1's loss
    NaN at the loop's forward `nan_at`: the fit the zero-change tests of a framework share (a bad
    night of one NaN, at the last check, after everything the other checks read had happened)."""
    return RayOrmasTrainer(
        loop,
        scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=name, storage_path=str(storage)),
        train_loop_config={"nan_at": nan_at},
        check_every=2,
        verbose=False,
        **kwargs,
    ).fit()


@pytest.fixture(scope="module")
def quickstart_fit(ray_cluster, tmp_path_factory):
    """Ray's quickstart loop unchanged, repaired; rank 1's loss NaN at the monitor's last check
    (3 epochs: the monitor steps 3 * per_epoch - 1 times)."""
    storage = tmp_path_factory.mktemp("quickstart")
    nan_step = last_check(3 * per_epoch() - 1)
    return adopted_fit(train_func_nan_on_rank_1, storage, "quickstart", nan_step + 1, repair=True), nan_step


@pytest.mark.timeout(300)
def test_the_quickstart_unchanged_gives_the_fleet_each_ranks_loss_and_a_nan_on_one_rank_is_named(quickstart_fit):
    result, nan_step = quickstart_fit
    check_the_fleet_names_rank_1s_nan(result.ormas.fleet.alarms, result.path, step=nan_step)


@pytest.mark.smoke
@pytest.mark.timeout(300)
def test_rays_quickstart_loop_unchanged_is_certified_and_repaired_identically_on_both_ranks(quickstart_fit):
    result, _ = quickstart_fit
    run = result.ormas

    # The digits' training split over 2 ranks, batches of 64: `per_epoch` optimizer steps per epoch.
    # The monitor met the model and its optimizer at the first step and stepped at every later one.
    steps_per_epoch = per_epoch()
    total = 3 * steps_per_epoch
    assert run.final["ormas/steps_per_rank"] == [total - 1, total - 1]
    link = json.loads((run.record_dir / "segment.json").read_text())
    assert link["step_offset"] == 1
    assert link["attached"]["by"] == "the optimizer step hook" and link["attached"]["optimizer"] == "Adam"
    assert link["attached"]["model"] == "DigitsCNN"
    assert link["attached"]["loss"].startswith("CrossEntropyLoss")
    assert verify_run(run.record_dir).ok

    # The lesion is certified and repaired, and both ranks hold the same weights at every report.
    assert {e["layer"] for e in events(run.record_dir, "certificate")} == {"conv2.0", "conv3.0"}
    assert {e["layer"] for e in events(run.record_dir, "repair")} == {"conv2.0", "conv3.0"}
    assert run.final["ormas/channels_repaired"] == 32 + 64
    for per_rank in run.digests():
        assert len(set(per_rank)) == 1
    rows = metric_rows(run.record_dir)
    assert all(isinstance(row["loss"], float) for row in rows)  # from the CrossEntropyLoss module

    # The loop's own ray.train.report calls carry the record: three user reports with ormas facts,
    # each checkpoint with a pointer into the record at the run step it was taken.
    kinds = [per_rank[0]["ormas/kind"] for per_rank in run.reports]
    assert kinds == ["user", "user", "user", "final"]
    assert [per_rank[0]["ormas/run_step"] for per_rank in run.reports[:3]] == [
        steps_per_epoch,
        2 * steps_per_epoch,
        total,
    ]
    assert result.metrics["epoch"] == 2 and result.metrics["ormas/kind"] == "user"
    pointer = result.checkpoint.get_metadata()["ormas"]["model"]
    assert pointer["run_steps"] == total and pointer["steps"] == total - 1
    assert diary(run.record_dir)[pointer["events"] - 1]["hash"] == pointer["last_hash"]

    # MLflow: one finished run, the loop's metric at the run's steps, the monitor's rows.
    client = MlflowClient(run.tracking_uri)
    tracked = client.get_run(run.mlflow_run_id)
    assert tracked.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.mlflow_run_id, "epoch")] == [
        steps_per_epoch,
        2 * steps_per_epoch,
        total,
    ]
    assert len(client.get_metric_history(run.mlflow_run_id, "ormas/loss")) == len(rows)
    assert run.fleet is not None and [r["rank"] for r in run.fleet.ranks] == [0, 1] and run.fleet.checks >= 2


def check_one_record_one_run_and_the_fleet(result, model_name: str) -> dict:
    """What every adopted run must leave: a verified record of `model_name`, attached by the
    framework's ormas-monitor callback; one finished MLflow run holding the monitor's rows; the
    fleet view with both ranks; both ranks' weights equal at every report."""
    run = result.ormas
    assert verify_run(run.record_dir).ok
    root = run.record_dir.parent.parent
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "fleet",
        "goodput",
        "model",
        "run.html",
    ]
    assert [p.name for p in (root / "model").iterdir()] == ["segment-000"]  # one monitor, one record
    link = json.loads((run.record_dir / "segment.json").read_text())
    assert link["attached"]["model"] == model_name
    rows = metric_rows(run.record_dir)
    assert rows and all(isinstance(row["loss"], float) for row in rows)
    client = MlflowClient(run.tracking_uri)
    tracked = client.get_run(run.mlflow_run_id)
    runs = client.search_runs([tracked.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run.mlflow_run_id]
    assert tracked.info.status == "FINISHED" and run.mlflow_complete
    assert len(client.get_metric_history(run.mlflow_run_id, "ormas/loss")) == len(rows)
    assert run.fleet is not None and [r["rank"] for r in run.fleet.ranks] == [0, 1] and run.fleet.checks >= 2
    for per_rank in run.digests():
        assert len(set(per_rank)) == 1
    return link


def local_trainer(loop, storage: Path, name: str, **kwargs) -> RayOrmasTrainer:
    """Ray Train's local mode: the loop runs in this process, so its warnings reach caplog."""
    return RayOrmasTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=0),
        verbose=False,
        progress=False,
        run_config=RunConfig(name=name, storage_path=str(storage)),
        **kwargs,
    )


def batches(count: int, size: int = 32):
    x, y, _, _ = load_digits(0)
    for i in range(count):
        yield x[i * size : (i + 1) * size], y[i * size : (i + 1) * size]


def accumulation_and_scaler_loop(config):
    """Gradient accumulation (2 micro-batches per optimizer step) under a GradScaler whose scale
    (2^16) makes scaled gradients obvious; one window's loss is infinite, so the scaler skips that
    optimizer step."""
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(DigitsCNN())
    criterion = CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    taken = 0
    for i, (x, y) in enumerate(batches(24)):
        loss = criterion(model(x), y)
        if i == 9:
            loss = loss * float("inf")
        scaler.scale(loss / 2).backward()
        if i % 2 == 1:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            taken += scaler.get_scale() >= before  # the scale drops only when the step was skipped
            optimizer.zero_grad()
    ray.train.report({"optimizer_steps": taken})
    return taken


@pytest.mark.timeout(300)
def test_accumulation_and_gradscaler_skips_the_monitor_sees_each_optimizer_step_with_true_gradients(storage):
    result = local_trainer(accumulation_and_scaler_loop, storage, "accumulate", check_every=1).fit()
    run = result.ormas
    assert result.return_value == 11 == run.final["ormas/run_step"]  # 12 windows, one skipped
    assert run.final["ormas/steps_per_rank"] == [10]  # every optimizer step but the first
    rows = metric_rows(run.record_dir)
    assert len(rows) == 10
    # Gradients at the hook are unscaled (GradScaler.step unscales before optimizer.step): a digits
    # CNN's layer gradients are O(1), scaled ones would be ~65536 times larger.
    assert max(g for row in rows for g in row["grad"].values()) < 100
    # The loss is the mean of the criterion's outputs since the monitor's last step (the loop made
    # window 5's loss infinite after the criterion, so the record's losses stay finite).
    assert all(math.isfinite(row["loss"]) for row in rows)
    assert verify_run(run.record_dir).ok


def two_model_loop(config):
    """A GAN-like loop: two models, two optimizers, one BCE loss module for both (with
    `own_losses`: a loss module each, the critic's and the generator's)."""
    torch.manual_seed(0)
    generator = ray.train.torch.prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh()))
    critic = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    critic_loss = torch.nn.BCEWithLogitsLoss()
    generator_loss = torch.nn.BCEWithLogitsLoss() if config.get("own_losses") else critic_loss
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for x, _ in batches(12):
        real = x.flatten(1)
        fake = generator(torch.randn(len(real), 8))
        c_loss = critic_loss(critic(real), torch.ones(len(real), 1)) + critic_loss(
            critic(fake.detach()), torch.zeros(len(real), 1)
        )
        opt_c.zero_grad()
        c_loss.backward()
        opt_c.step()
        g_loss = generator_loss(critic(fake), torch.ones(len(real), 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("own_losses", [False, True], ids=["one-loss-module", "a-loss-module-each"])
def test_two_models_with_two_optimizers_get_a_monitor_each_and_the_record_says_there_is_no_loss(
    storage, caplog, own_losses
):
    name = f"two-models-{own_losses}"
    trainer = local_trainer(two_model_loop, storage, name, check_every=1, train_loop_config={"own_losses": own_losses})
    run = trainer.fit().ormas
    root = storage / name / "ormas"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "goodput",
        "model",
        "run.html",
        "sequential",
    ]
    links = {
        name: json.loads((root / name / "segment-000" / "segment.json").read_text()) for name in ("model", "sequential")
    }
    assert links["model"]["attached"]["optimizer"] == links["sequential"]["attached"]["optimizer"] == "Adam"
    # The critic's optimizer steps first: it is "model", with the loss module met at its first step,
    # dropped when the generator's optimizer came; no loss module takes the generator's output.
    critic, generator = links["model"]["attached"], links["sequential"]["attached"]
    assert critic["loss"] is None and "several models are trained" in critic["loss_note"]
    assert generator["loss"] is None and "no loss module took the model's output" in generator["loss_note"]
    assert run.final["ormas/steps_per_rank"] == [11]
    assert verify_run(root / "model" / "segment-000").ok and verify_run(root / "sequential" / "segment-000").ok
    # No row of either record carries a loss: not the critic's first one either, which the
    # generator's loss (computed through the critic, into the shared loss module) once reached.
    rows = ray_ormas.open_records(storage / name).metrics().to_pylist()
    assert len(rows) == 2 * 11 and {r["monitor"] for r in rows} == {"model", "sequential"}
    assert [r for r in rows if r["loss"] is not None and not math.isnan(r["loss"])] == []
    assert run.final.get("ormas/loss") is None, run.final


def functional_loss_loop(config):
    model = ray.train.torch.prepare_model(DigitsCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    stray = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)  # steps no model
    for x, y in batches(8):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stray.step()


@pytest.mark.timeout(300)
def test_a_functional_loss_and_an_optimizer_of_no_model_are_said_at_the_first_step(storage, caplog):
    run = local_trainer(functional_loss_loop, storage, "functional", check_every=1).fit().ormas
    link = json.loads((run.record_dir / "segment.json").read_text())
    assert link["attached"]["loss"] is None and "F.cross_entropy" in link["attached"]["loss_note"]
    rows = metric_rows(run.record_dir)
    assert rows and all(row["loss"] is None for row in rows)  # gradients and channels checked, no loss
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("ray_ormas")]
    assert sum("SGD steps the parameters of no model the loop called" in w for w in warned) == 1
    assert any("ray_ormas.monitor(model, optimizer)" in w for w in warned)


def explicit_then_auto_loop(config):
    model = ray.train.torch.prepare_model(DigitsCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = ray_ormas.monitor(model, optimizer) if config.get("explicit_first") else None
    for step, (x, y) in enumerate(batches(6)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if mon is not None:
            mon.step(loss)
        optimizer.step()
        if step == 2 and config.get("explicit_late"):
            ray_ormas.monitor(model, optimizer)
        if step == 2 and config.get("twice"):
            ray_ormas.monitor(model, optimizer, name="again")


@pytest.mark.timeout(300)
def test_the_loops_own_monitor_wins_and_two_monitors_on_one_model_are_refused(storage):
    explicit = (
        local_trainer(
            explicit_then_auto_loop, storage, "explicit", check_every=1, train_loop_config={"explicit_first": True}
        )
        .fit()
        .ormas
    )
    assert "attached" not in json.loads((explicit.record_dir / "segment.json").read_text())
    assert explicit.final["ormas/steps_per_rank"] == [6]  # its own steps: nothing else attached
    assert sorted(p.name for p in (storage / "explicit" / "ormas").iterdir() if not p.name.startswith(".")) == [
        "goodput",
        "model",
        "run.html",
    ]
    with pytest.raises(
        ValueError,
        match=r"two monitors claim one model: DistributedDataParallel|two monitors claim "
        r"one model: DigitsCNN .* attached by the optimizer step hook\. Call "
        r"ray_ormas\.monitor\(model, optimizer\) before the model's first",
    ):
        local_trainer(explicit_then_auto_loop, storage, "late", train_loop_config={"explicit_late": True}).fit()
    with pytest.raises(
        ValueError,
        match=r"two monitors claim one model: DigitsCNN \(or a model sharing its "
        r"parameters\) already has monitor 'model'",
    ):
        local_trainer(
            explicit_then_auto_loop, storage, "twice", train_loop_config={"explicit_first": True, "twice": True}
        ).fit()


def test_a_framework_without_its_extra_is_an_error_on_the_driver_naming_the_extra(tmp_path):
    """Lightning missing (an import blocker stands in for an environment without it): the loop
    uses ray.train.lightning, so RayOrmasTrainer(...) fails before Ray starts, naming the extra."""
    code = """
import sys
class NoLightning:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lightning", "pytorch_lightning"):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, NoLightning())
import ray, ray_ormas
def loop():
    import ray.train.lightning
    trainer = ray.train.lightning.prepare_trainer(None)
try:
    ray_ormas.RayOrmasTrainer(loop)
except ImportError as e:
    print("refused:", e)
ray_ormas.RayOrmasTrainer(loop, auto_monitor=False)
print("without auto_monitor: built; ray initialized:", ray.is_initialized())
"""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert len(ran.stdout.splitlines()) >= 2, (ran.stdout, ran.stderr[-3000:])
    refused, built = ran.stdout.splitlines()[-2:]
    assert (
        refused.startswith("refused: the training loop uses lightning")
        and "pip install 'ray-ormas[lightning]'" in refused
        and "auto_monitor=False" in refused
    )
    assert built == "without auto_monitor: built; ray initialized: False"


def test_which_frameworks_a_loop_uses_is_read_from_its_code_and_module():
    from ray_ormas._internal.worker.adoption import frameworks_of

    from .lightning_quickstart import lightning_train_func
    from .transformers_quickstart import transformers_train_func

    assert frameworks_of(lightning_train_func) == ("lightning",)
    assert frameworks_of(transformers_train_func) == ("transformers",)
    assert frameworks_of(train_func) == frameworks_of(two_model_loop) == ()


def test_a_changed_report_seam_is_said_and_leaves_the_loops_reports_unrouted(caplog, monkeypatch):
    """Ray Train's TrainFnUtils is private: checked against Ray 2.60's, and a change (simulated by
    expecting one more parameter than the installed Ray has) is one error line, not a failure."""
    from ray_ormas._internal.seams import ray_train
    from ray_ormas._internal.worker import report_route

    assert ray_train.report_seam() is not None
    monkeypatch.setattr(ray_train, "REPORT_PARAMETERS", (*ray_train.REPORT_PARAMETERS, "upload_timeout_s"))
    with pytest.raises(ray_ormas.RaySeamChanged, match=r"TrainFnUtils\.report takes .* not "):
        ray_train.report_seam()
    assert report_route.ReportRoute(lambda *args: None).install() is False
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "cannot carry the record on this Ray version" in line and "ray_ormas.report" in line


def test_the_framework_hooks_exist_only_inside_a_ray_ormas_loop():
    import lightning.pytorch as pl
    import transformers

    from ray_ormas._internal.worker.integrations.transformers import TrainerHook

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert not any(type(cb).__module__.startswith("ray_ormas") for cb in trainer.callbacks)
    original = transformers.Trainer.train
    hook = TrainerHook()
    hook.install()
    assert transformers.Trainer.train is not original and transformers.Trainer.train.__wrapped__ is original
    hook.remove()
    assert transformers.Trainer.train is original
