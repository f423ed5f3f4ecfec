"""`ray-ormas train CONFIG.yaml`: config errors before Ray starts (exit 2), the examples run as
written (exit 0) on the session's Ray cluster, a failing loop exits 1."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from ormas_monitor.record import verify_run

from ray_ormas import BatchSize, FleetSettings, MLflowSettings, MonitorSettings, PreflightSettings
from ray_ormas._internal.cli import main as cli
from ray_ormas._internal.common.job_config import ConfigError, load_config, schema_reference

from .conftest import ROOT
from .loops import diagnose_rank_1_at_check_3

EXAMPLES = ROOT / "examples"


@pytest.fixture
def console(capsys, caplog):
    """What the command prints (its output) and what it logs (`ray_ormas` records)."""
    caplog.set_level(logging.INFO, logger="ray_ormas")
    return capsys, caplog


def run(console, *args: str) -> tuple[int, str, str]:
    """(exit code, the output and the INFO records, the WARNING-and-above records)."""
    capsys, caplog = console
    caplog.clear()
    code = cli.main(["train", *args])
    out = capsys.readouterr().out
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("ray_ormas")]
    notes = [m for level, m in logged if level < logging.WARNING]
    problems = [m for level, m in logged if level >= logging.WARNING]
    return code, "\n".join([out, *notes]), "\n".join(problems)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


MINIMAL = """
name: t
model: {target: "examples.digits:cnn"}
data: {target: "examples.digits:datasets"}
train: {epochs: 1, batch: {size: 32}}
"""


@pytest.mark.parametrize(
    "body, overrides, words",
    [
        (MINIMAL.replace("epochs: 1", "epocs: 1"), [], ["train.epocs: unknown key", "train.epochs: Field required"]),
        (MINIMAL, ["train.batch.size=0"], ["train.batch.size: Input should be greater than or equal to 1"]),
        (MINIMAL, ["model.target=examples.nothere:cnn"], ["model.target: cannot import module 'examples.nothere'"]),
        (
            MINIMAL,
            ["model.target=examples.digits:nothere"],
            ["model.target: module 'examples.digits' has no attribute"],
        ),
        (MINIMAL, ["optimizer.name=Adamm"], ["optimizer.name: torch.optim has no optimizer 'Adamm'"]),
        (MINIMAL, ["monitor.thresholds={patience: 0}"], ["monitor.thresholds", "patience"]),
        (MINIMAL, ["strategy=deepspeed"], ["strategy: Input should be 'ddp' or 'fsdp'"]),
        (MINIMAL, ["train.loss=cross_entropi"], ["train.loss: torch.nn.functional has no 'cross_entropi'"]),
        (MINIMAL.replace('model: {target: "examples.digits:cnn"}\n', ""), [], ["give `model` and `data`"]),
        (MINIMAL, ["name=bad name"], ["name: String should match pattern"]),
        (
            MINIMAL,
            ["train.batch={size: 30, per: global}", "scaling.workers=4"],
            ["a global batch of 30 does not split evenly over 4 workers", "scaling.workers in a YAML config"],
        ),
        (MINIMAL, ["scaling.workers=[4, 2]"], ["scaling.workers: the elastic range [4, 2] has its minimum above"]),
        (MINIMAL, ["scaling.workers=[0, 4]"], ["scaling.workers: the elastic range [0, 4] starts below 1 worker"]),
        (MINIMAL, ["scaling.workers=0"], ["scaling.workers: give 1 or more workers (got 0)"]),
        (
            MINIMAL,
            ["train.batch={size: 5, per: global}", "scaling.workers=[2, 4]"],
            [
                "a global batch of 5 (1 accumulation step(s)) splits evenly at no world size",
                "scaling.workers in a YAML",
            ],
        ),
        (MINIMAL, ["strategy=fsdp", "monitor.repair=true"], ["repair is not possible with strategy='fsdp'"]),
        (MINIMAL, ["sync_batchnorm=true"], ["sync_batchnorm=True needs GPU workers"]),
        (MINIMAL, ["trainn.epochs=2"], ["trainn: unknown key"]),
        (MINIMAL, ["train.epochs"], ["--set expects key.path=value"]),
        (MINIMAL, ["storage.path=foo://bucket/runs"], ["storage.path: 'foo://bucket/runs' has the scheme 'foo'"]),
        (
            MINIMAL,
            ["storage.path=/no/such/parent/runs"],
            ["storage.path: '/no/such/parent/runs': its parent folder /no/such/parent does not exist"],
        ),
        (MINIMAL, ["storage.record_dir=/no/such/parent/records"], ["storage.record_dir: '/no/such/parent/records'"]),
        (MINIMAL, ["scaling.resources_per_worker={GPU: 1}"], ["scaling: `use_gpu` is False but `GPU` was found"]),
        (
            MINIMAL,
            ["mlflow.log_checkpoints=bestest"],
            ["mlflow.log_checkpoints: Input should be 'none', 'last', 'best'"],
        ),
        (MINIMAL, ["mlflow.log_checkpoints=best"], ["mlflow: log_checkpoints='best' needs checkpoint_metric"]),
        (MINIMAL, ["mlflow.experiment=e"], ["mlflow.experiment: unknown key"]),
        (MINIMAL, ["fleet.nccl_hang_detector=on"], ["fleet.nccl_hang_detector: `on` is not a mode"]),
        (MINIMAL, ["mlflow.max_pending=5"], ["mlflow.max_pending: Input should be greater than or equal to 1000"]),
        ("- a list\n", [], ["must hold a mapping of sections"]),
        ("name: [unclosed\n", [], ["is not valid YAML"]),
    ],
)
def test_config_errors_exit_2_naming_the_key_before_ray_starts(console, tmp_path, body, overrides, words):
    import ray

    was_running = ray.is_initialized()
    code, out, err = run(console, str(write(tmp_path, body)), *[a for o in overrides for a in ("--set", o)])
    assert code == 2, (out, err)
    for w in words:
        assert w in err, err
    assert ray.is_initialized() == was_running


# Every field of every settings class, set to a value other than its default: (YAML value, Python value).
NOT_DEFAULT = {
    MonitorSettings: {
        "repair": ("all", "all"),
        "check_every": (7, 7),
        "thresholds": ({"patience": 2}, {"patience": 2}),
        "layers": (["conv*", "fc"], ("conv*", "fc")),
        "verbose": (False, False),
        "progress": (False, False),
        "ray_report_lines": (True, True),
        "report_every": (3, 3),
        "sync_timeout_s": (60.5, 60.5),
        "auto_monitor": (False, False),
    },
    MLflowSettings: {
        "enabled": (True, True),
        "tracking_uri": ("sqlite:///m.db", "sqlite:///m.db"),
        "experiment_name": ("e", "e"),
        "run_name": ("r", "r"),
        "tags": ({"a": "b"}, {"a": "b"}),
        "run_id": (None, None),
        "request_timeout_s": (2.5, 2.5),
        "log_checkpoints": ("best", "best"),
        "checkpoint_metric": ("val_loss", "val_loss"),
        "checkpoint_mode": ("max", "max"),
        "max_pending": (5000, 5000),
    },
    FleetSettings: {
        "enabled": (True, True),
        "slow_score": (0.7, 0.7),
        "slow_checks": (5, 5),
        "min_excess": (0.3, 0.3),
        "divergence": (False, False),
        "ray_metrics": (False, False),
        "mlflow_ranks": (8, 8),
        "metrics_ranks": (16, 16),
        "record_ranks": (8, 8),
        "record_rows_every": (25, 25),
        "nccl_hang_detector": ("observe", "observe"),
        "nccl_hang_confirm_s": (120, 120.0),
        "hang_after_s": (30, 30.0),
        "actions": ({"hang": "stop"}, {"hang": ("stop",)}),
        "max_actions": (5, 5),
        "evict_scope": ("cluster", "cluster"),
        "max_evict_nodes": (2, 2),
        "policy": ("tests.loops:diagnose_rank_1_at_check_3", diagnose_rank_1_at_check_3),
        "preflight": ({"factor": 3, "repeats": 2}, PreflightSettings(factor=3.0, repeats=2)),
    },
    BatchSize: {"size": (30, 30), "per": ("global", "global"), "accumulation": (3, 3)},
}
SECTION = {MonitorSettings: "monitor", MLflowSettings: "mlflow", FleetSettings: "fleet", BatchSize: "train.batch"}


def test_the_yaml_sections_are_the_python_settings_and_every_field_round_trips(tmp_path):
    """One options model: each YAML section is the Python API's settings class, with its defaults;
    a config that sets every field gives the trainer exactly what the same Python options give."""
    from ray.train import ScalingConfig

    from ray_ormas import RayOrmasTrainer
    from ray_ormas._internal.cli.train import build_trainer
    from ray_ormas._internal.common.job_config import JobConfig

    for cls, values in NOT_DEFAULT.items():
        names = [f.name for f in dataclasses.fields(cls)]
        assert sorted(values) == sorted(names), f"{cls.__name__}: a field is missing here"
        if cls is not BatchSize:
            assert JobConfig.model_fields[SECTION[cls]].annotation is cls
            assert (
                getattr(
                    JobConfig.from_dict(
                        {
                            "name": "n",
                            "loop": {"target": "tests.loops:digits_loop"},
                            "train": {"epochs": 1, "batch": {"size": 1}},
                        }
                    ),
                    SECTION[cls],
                )
                == cls()
            )
        for name, (_, python) in values.items():
            if name not in ("enabled", "run_id"):
                assert python != getattr(cls(**({"size": 1} if cls is BatchSize else {})), name), (cls, name)
    overrides = [
        f"{SECTION[cls]}.{name}={json.dumps(yaml_value)}"
        for cls, values in NOT_DEFAULT.items()
        for name, (yaml_value, _) in values.items()
    ]
    body = MINIMAL + f"storage: {{path: {tmp_path}}}\nscaling: {{workers: 2, use_gpu: true}}\n"
    job = load_config(write(tmp_path, body), overrides)  # GPU workers: the hang detector needs them
    from_yaml = build_trainer(job)
    python = {cls: cls(**{name: value for name, (_, value) in values.items()}) for cls, values in NOT_DEFAULT.items()}
    m = python[MonitorSettings]
    from_python = RayOrmasTrainer(
        lambda: None,
        repair=m.repair,
        check_every=m.check_every,
        monitor_config=m.config,
        layers=list(m.layers),
        verbose=m.verbose,
        progress=m.progress,
        ray_report_lines=m.ray_report_lines,
        report_every=m.report_every,
        sync_timeout_s=m.sync_timeout_s,
        auto_monitor=m.auto_monitor,
        mlflow=python[MLflowSettings],
        fleet=python[FleetSettings],
        batch=python[BatchSize],
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
    )
    assert from_yaml.settings == from_python.settings == m
    assert from_yaml.mlflow == from_python.mlflow == python[MLflowSettings]
    assert from_yaml.batches == from_python.batches
    assert from_yaml.fleet == from_python.fleet == python[FleetSettings] and job.train.batch == python[BatchSize]


def test_the_settings_defaults_are_the_yaml_defaults():
    from ray_ormas._internal.common.job_config import JobConfig

    job = JobConfig.from_dict(
        {"name": "n", "loop": {"target": "tests.loops:digits_loop"}, "train": {"epochs": 1, "batch": {"size": 4}}}
    )
    assert (job.monitor, job.mlflow, job.fleet) == (MonitorSettings(), MLflowSettings(), FleetSettings())
    assert job.monitor.verbose is True and job.monitor.progress is True


def test_missing_config_file_and_bad_usage(console, tmp_path):
    code, _, err = run(console, str(tmp_path / "none.yaml"))
    assert code == 2 and "config file" in err and "not found" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["train"])
    assert e.value.code == 2


def test_dry_run_prints_the_resolved_config(console, tmp_path):
    code, out, _ = run(
        console,
        str(EXAMPLES / "digits_watch.yaml"),
        "--dry-run",
        "--set",
        "monitor.repair=true",
        "--set",
        f"storage.path={tmp_path}",
    )
    assert code == 0 and "config is valid" in out
    assert "repair: true" in out and f"path: {tmp_path}" in out and "check_every: 10" in out
    assert not list(tmp_path.iterdir())


def test_every_example_config_is_valid():
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert names == ["digits_repair.yaml", "digits_watch.yaml", "gan.yaml", "transformer_fsdp.yaml"]
    for name in names:
        load_config(EXAMPLES / name)
    with pytest.raises(ConfigError):
        load_config(EXAMPLES / "digits_watch.yaml", ["train.batch.per=node"])


def test_docs_cli_md_holds_the_generated_config_reference():
    assert schema_reference() in (ROOT / "docs" / "cli.md").read_text(), (
        "docs/cli.md is out of date: paste the output of python -m ray_ormas._internal.common.job_config into it"
    )


# ---------------------------------------------------------------- the examples, for real
def finished(console, tmp_path: Path, example: str, *overrides: str) -> str:
    args = [str(EXAMPLES / example), "--set", f"storage.path={tmp_path}", "--set", "mlflow.enabled=false"]
    code, out, err = run(console, *args, *[a for o in overrides for a in ("--set", o)])
    assert code == 0, err[-3000:]
    return out


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_the_digits_repair_example_heals_and_running_it_again_continues_the_run(console, tmp_path):
    # The watch example's certificates are checked on docs/cli.md's run of it (tests/test_doc_commands.py).
    repair = finished(console, tmp_path, "digits_repair.yaml", "train.epochs=3")
    assert "conv2.0       0         32        32             0  repaired" in repair
    assert "conv3.0       0         64        64             0  repaired" in repair
    accuracy = json.loads(repair.split("final metrics: ")[1].split("\n")[0])["val_accuracy"]
    assert accuracy > 0.9
    # The same command again continues the run: it says so first, trains nothing (every epoch is
    # done) and says that, and the summary is still the whole run's, never the empty segment's.
    # The rerun starts a new segment beside the first, which it leaves byte for byte as it was.
    record = tmp_path / "digits-repair" / "ormas" / "model"
    before = (record / "segment-000" / "diary.jsonl").read_bytes()
    args = [str(EXAMPLES / "digits_repair.yaml"), "--set", f"storage.path={tmp_path}", "--set", "mlflow.enabled=false"]
    code, again, said = run(console, *args, "--set", "train.epochs=3")
    assert code == 0, said[-3000:]
    assert sorted(p.name for p in record.iterdir()) == ["segment-000", "segment-001"]
    assert (record / "segment-000" / "diary.jsonl").read_bytes() == before
    assert verify_run(record / "segment-001").ok
    first = said.splitlines()[0]
    run_dir = tmp_path / "digits-repair"
    assert first.startswith(f"[ray-ormas] continuing the existing run at {run_dir} (1 record segment so far)"), first
    assert "from its latest checkpoint, checkpoint_" in first and "(epoch 2, run step " in first, first
    assert (
        "Ray Train continues a run with the same name and storage" in first and "another RunConfig(name=...)" in first
    )
    assert "nothing was left to train" in said
    assert "the whole run: 2 segments" in again
    # Its fleet part says in one line that this fit had nothing to compare, never an empty table.
    (fleet_line,) = [line for line in again.splitlines() if line.startswith("fleet:")]
    assert fleet_line.startswith("fleet: nothing in this fit") and fleet_line.endswith(str(run_dir / "ormas" / "fleet"))
    assert "conv2.0       0         32        32             0  repaired" in again
    record = tmp_path / "digits-repair" / "ormas" / "model" / "segment-000"
    assert verify_run(record).ok and (record / "report.html").is_file()
    assert len([p for p in (tmp_path / "digits-repair").glob("checkpoint_*") if p.is_dir()]) == 2


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_transformer_fsdp_example(console, tmp_path):
    # The GAN example (examples/gan.yaml) runs as docs/cli.md submits it, with `ray job submit`
    # (tests/test_doc_commands.py: one monitor and one verified record per model).
    out = finished(console, tmp_path, "transformer_fsdp.yaml", "train.epochs=1")
    record = tmp_path / "transformer-fsdp" / "ormas" / "model" / "segment-000"
    manifest = next(json.loads(x) for x in (record / "diary.jsonl").read_text().splitlines() if '"manifest"' in x)
    assert manifest["distributed"]["mode"] == "fsdp" and manifest["channel_checks"] is False
    assert "monitor 'model'" in out and verify_run(record).ok


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_a_failing_loop_exits_1_and_says_why(console, tmp_path):
    code, _, err = run(
        console,
        str(EXAMPLES / "digits_watch.yaml"),
        "--set",
        f"storage.path={tmp_path}",
        "--set",
        "mlflow.enabled=false",
        "--set",
        "train.loss=tests.loops:failing_loss",
    )
    assert code == 1 and "training failed" in err and "loss function failed on purpose" in err
    (last,) = [line for line in err.splitlines() if line.startswith("ray-ormas train: training failed after")]
    assert "on rank" in last, last  # the root cause per rank, in one paragraph: no stack
    assert "loss function failed on purpose" in last and "Traceback" not in last
