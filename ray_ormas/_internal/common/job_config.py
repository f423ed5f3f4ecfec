"""The schema of `ray-ormas train CONFIG.yaml`: one file, from a laptop to a KubeRay cluster.

    name: digits-repair
    model: {target: "examples.digits:lesioned_cnn"}
    data: {target: "examples.digits:datasets"}
    optimizer: {name: AdamW, lr: 0.003, kwargs: {weight_decay: 0.01}}
    train: {epochs: 12, batch: {size: 64, per: global}}
    scaling: {workers: 2}
    monitor: {repair: true, check_every: 10}

Validated with pydantic (v2), because Ray already depends on it, and because it gives what a config
needs for free: every error names its key path (`train.batch.size: Input should be greater than or
equal to 1`), unknown keys are refused (a typo never silently falls back to a default), values are
coerced from YAML's types, and the field descriptions are the reference in docs/cli.md
(`schema_reference()`, checked by a test). The `monitor:`, `mlflow:`, `fleet:` and `train.batch:`
sections are the Python API's own settings classes (`MonitorSettings`, `MLflowSettings`,
`FleetSettings`, `BatchSize`; common/options.py), so the two cannot drift apart. Checks that need two
sections at once (a global batch split over workers, repair with FSDP, SyncBatchNorm without GPUs)
are the trainer's own, run on the driver when the CLI builds it, before Ray starts.

`module:function` targets are imported while validating, on the driver, so a missing module or
function is a config error before any worker starts; the current directory is importable, as
it is for `python -m` (and under `ray job submit --working-dir`, the working dir is the current
directory).
"""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Sequence, Union, cast, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from ray_ormas._internal.common.fleet_settings import FleetSettings
from ray_ormas._internal.common.mlflow_settings import MLflowSettings
from ray_ormas._internal.common.options import describe_errors
from ray_ormas._internal.common.scaling import elastic_range
from ray_ormas._internal.common.settings import BatchSize, MonitorSettings
from ray_ormas.errors import ConfigError, OptionError

TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def load_target(target: str) -> Callable[..., Any]:
    """Import `module:attribute` (dots allowed on both sides)."""
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"cannot import module {module_name!r} ({e}); run from the folder that contains it, or install it"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{target} is a {type(obj).__name__}, not a function or class")
    return obj


class Factory(Section):
    """A callable named `module:function`, called with `kwargs`."""

    target: str = Field(description="`module:function` (or `module:Class`), importable from the current directory")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the call")

    @field_validator("target")
    @classmethod
    def _importable(cls, value: str) -> str:
        if not TARGET.match(value):
            raise OptionError(f"expected 'module:function', got {value!r}")
        load_target(value)
        return value

    def build(self, **extra: Any) -> Any:
        return load_target(self.target)(**{**self.kwargs, **extra})


class OptimizerSection(Section):
    name: str = Field(default="AdamW", description="a class in `torch.optim` (AdamW, SGD, Adam, ...)")
    lr: PositiveFloat = Field(default=1e-3, description="learning rate")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="other keyword arguments of the optimizer")

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        import torch

        found = getattr(torch.optim, value, None)
        if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
            raise OptionError(f"torch.optim has no optimizer {value!r}; e.g. AdamW, SGD, Adam")
        return value


class TrainSection(Section):
    epochs: PositiveInt = Field(description="passes over the training data")
    batch: BatchSize = Field(description="batch size and its meaning")
    seed: int = Field(default=0, description="torch seed (model initialisation, shuffling)")
    loss: str = Field(
        default="cross_entropy",
        description="a function of `torch.nn.functional`, or `module:function` called as `loss(outputs, targets)`",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description="`bf16`: bf16 autocast; `fp16`: fp16 autocast with a GradScaler given to the monitor",
    )
    checkpoint_every: PositiveInt | None = Field(
        default=1, description="epochs between checkpoints (null: none); a restarted run resumes from the last one"
    )
    keep_checkpoints: PositiveInt | None = Field(default=2, description="checkpoints kept in storage (null: all)")

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        if ":" in value:
            Factory(target=value)
            return value
        import torch.nn.functional as F

        if not callable(getattr(F, value, None)):
            raise OptionError(
                f"torch.nn.functional has no {value!r}; use e.g. cross_entropy, mse_loss, or 'module:function'"
            )
        return value


class ScalingSection(Section):
    workers: Union[int, list[int]] = Field(
        default=1,
        description="Ray Train workers (ranks): a number, or `[min, max]` for an elastic fit that Ray "
        "restarts at another size as nodes come and go (docs/elastic.md)",
    )
    use_gpu: bool = Field(default=False, description="one GPU per worker")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="e.g. {CPU: 4, GPU: 1}; Ray's defaults if empty"
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _elastic_range(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            elastic_range(value)  # raises, saying what to give
            return list(value)
        if isinstance(value, bool):
            raise OptionError(f"give a number of workers (got {value}), or [min, max] for an elastic fit")
        if isinstance(value, int) and value < 1:
            raise OptionError(f"give 1 or more workers (got {value}), or [min, max] for an elastic fit")
        return value

    @property
    def num_workers(self) -> int | tuple[int, int]:
        """What `ScalingConfig(num_workers=...)` takes: the count, or the elastic (min, max)."""
        return self.workers if isinstance(self.workers, int) else (self.workers[0], self.workers[1])

    @property
    def min_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[0]

    def describe(self) -> str:
        """'2 worker(s)', or '1 to 4 workers (elastic)'."""
        if isinstance(self.workers, int):
            return f"{self.workers} worker(s)"
        return f"{self.workers[0]} to {self.workers[1]} workers (elastic)"


class StorageSection(Section):
    path: str = Field(
        default="~/ray_results",
        description="run storage (`RunConfig.storage_path`): a local or shared path, or a URI (s3://bucket/runs)",
    )
    record_dir: str | None = Field(default=None, description="where the record goes if not beside the checkpoints")


class FailureSection(Section):
    max_failures: int = Field(
        default=0, ge=-1, description="worker-group restarts (from the last checkpoint); -1: unlimited"
    )
    controller_failure_limit: int = Field(
        default=-1,
        ge=-1,
        description="failed worker-group starts tolerated (e.g. waiting for a lost node); -1: unlimited",
    )


class JobConfig(Section):
    """A whole `ray-ormas train` job."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the run's name (`RunConfig.name`): its folder in storage"
    )
    model: Factory | None = Field(default=None, description="builds the `nn.Module` (built-in loop)")
    data: Factory | None = Field(
        default=None,
        description="returns `{'train': Dataset, 'val': Dataset or None}` of (input, target) pairs (built-in loop)",
    )
    loop: Factory | None = Field(
        default=None,
        description="a training loop of your own, `fn(config)`, instead of the "
        "built-in one; it gets this whole config as a dict",
    )
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="the optimizer")
    train: TrainSection = Field(description="epochs, batch, loss, precision, checkpoints")
    strategy: Literal["ddp", "fsdp"] = Field(default="ddp", description="`ddp` or `fsdp` (FSDP2)")
    sync_batchnorm: bool = Field(default=False, description="convert BatchNorm to SyncBatchNorm (ddp on GPUs)")
    parallel_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="for DDP (e.g. static_graph: true) or fully_shard (e.g. shard_modules: 'blocks.*')",
    )
    scaling: ScalingSection = Field(default_factory=ScalingSection, description="workers and resources")
    monitor: MonitorSettings = Field(
        default_factory=MonitorSettings, description="the ormas monitor (`ray_ormas.MonitorSettings`)"
    )
    mlflow: MLflowSettings = Field(
        default_factory=MLflowSettings, description="MLflow tracking (`ray_ormas.MLflowSettings`)"
    )
    fleet: FleetSettings = Field(
        default_factory=FleetSettings,
        description="fleet health: stragglers, divergence, non-finite values, per rank (`ray_ormas.FleetSettings`)",
    )
    storage: StorageSection = Field(default_factory=StorageSection, description="where the run persists")
    failure: FailureSection = Field(default_factory=FailureSection, description="restarts")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> JobConfig:
        """Validate a parsed YAML config: the settings classes in lax mode, which takes YAML's types."""
        return cls.model_validate(raw, strict=False)

    @model_validator(mode="after")
    def _loop_or_model_and_data(self) -> JobConfig:
        if self.loop is None and (self.model is None or self.data is None):
            raise ValueError("give `model` and `data` (the built-in training loop), or `loop` (your own)")
        return self


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> JobConfig:
    """Read a YAML config, apply `key.path=value` overrides (values parsed as YAML), validate."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (name, model, data, train, ...), got {type(raw).__name__}"
        )
    for item in overrides:
        apply_override(raw, item)
    try:
        return JobConfig.from_dict(raw)
    except ValidationError as e:
        raise ConfigError(describe(e, str(path))) from None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """`a.b.c=value` into the nested dict (value parsed as YAML: 3, true, null, [a, b], text)."""
    key, sep, text = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set expects key.path=value, got {item!r}")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def describe(error: ValidationError, source: str) -> str:
    """A config's validation error: the file, then one line per problem naming its key path."""
    problems = describe_errors(
        error,
        unknown="unknown key (check the spelling; `ray-ormas train --help` lists the sections)",
        show_input=False,
        top_level="(top level)",
    )
    return "\n".join([f"{source}: {error.error_count()} problem(s):", *(f"  {line}" for line in problems)])


def schema_reference() -> str:
    """Markdown tables of every config key, from the schema (docs/cli.md embeds this)."""
    out: list[str] = []

    def section(model: type[BaseModel], prefix: str) -> None:
        rows = []
        nested = []
        for name, field in _fields(model).items():
            ann = field.annotation
            sub = _section_type(ann)
            if sub is not None and sub is not Factory:
                nested.append((f"{prefix}{name}", sub))
            default = "required" if field.is_required() else _default(field)
            rows.append(f"| `{prefix}{name}` | {_type_name(ann)} | {default} | {field.description or ''} |")
        out.append(f"\n### `{prefix.rstrip('.') or 'top level'}`\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        out.extend(rows)
        for key, sub in nested:
            section(sub, f"{key}.")

    section(JobConfig, "")
    out.append("\n### `model`, `data`, `loop` (a factory)\n")
    out.append("| key | type | default | meaning |\n|---|---|---|---|")
    for name, field in Factory.model_fields.items():
        default = "required" if field.is_required() else _default(field)
        out.append(f"| `{name}` | {_type_name(field.annotation)} | {default} | {field.description} |")
    return "\n".join(out).strip() + "\n"


def _is_section(c: Any) -> bool:
    """A BaseModel or a pydantic dataclass (the settings classes)."""
    return isinstance(c, type) and (issubclass(c, BaseModel) or hasattr(c, "__pydantic_fields__"))


def _fields(model: type) -> dict[str, Any]:
    return model.model_fields if issubclass(model, BaseModel) else cast(Any, model).__pydantic_fields__


def _section_type(ann: Any) -> type | None:
    candidates = [ann, *getattr(ann, "__args__", ())]
    for c in candidates:
        if _is_section(c):
            return c
    return None


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if _is_section(type(value)):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _type_name(ann: Any) -> str:
    origin, args = get_origin(ann), get_args(ann)
    if ann is type(None):
        return "null"
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is dict:
        return "mapping"
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}"
    if _is_section(ann):
        return "factory" if ann is Factory else "section"
    return getattr(ann, "__name__", str(ann))


if __name__ == "__main__":  # python -m ray_ormas._internal.common.job_config > the reference part of docs/cli.md
    print(schema_reference(), end="")
