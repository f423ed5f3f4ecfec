"""Frozen, validated settings that travel from the driver to every worker.

`MonitorSettings` holds what ray-ormas needs to build the same `ormas_monitor.Monitor` on every
rank and to report its record: the repair mode, the check interval and the monitor's other
thresholds (checked by ormas-monitor's own `MonitorConfig`), the layer filter, what rank 0
prints, and the reporting cadence. `BatchSize` says what a batch size means. Both are pydantic
dataclasses (common/options.py): the YAML config's `monitor:` and `train.batch:` sections are these
classes, so Python and YAML share fields, defaults and checks. Everything is checked on
construction, on the driver, so a bad option fails before any Ray worker starts.

    settings = MonitorSettings(repair=True, check_every=20, thresholds={"patience": 2})
    settings = MonitorSettings.build(repair=True, monitor_config=MonitorConfig(check_every=20))

`STRATEGIES` are the parallel strategies `ray.train.torch.prepare_model` knows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Sequence

from ormas_monitor import MonitorConfig
from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from ray_ormas._internal.common.options import SETTINGS_CONFIG, build, refuse_as_option_error
from ray_ormas.errors import OptionError, OptionTypeError

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
RepairMode = bool | Literal["all"]

DEFAULT_SYNC_TIMEOUT_S = 900.0
DEFAULT_CHECK_EVERY = MonitorConfig().check_every


def check_strategy(strategy: Any) -> str:
    """`strategy` if it is one ray-ormas supports, else a ValueError that lists them."""
    if strategy not in STRATEGIES:
        raise OptionError(f"strategy must be one of {', '.join(repr(s) for s in STRATEGIES)}, got {strategy!r}")
    return strategy


@refuse_as_option_error
@dataclass(frozen=True, config=SETTINGS_CONFIG)
class MonitorSettings:
    """How every rank builds and reports its monitor (the YAML config's `monitor:` section).

    Attributes:
        repair: False (watch only), True (repair certified, constant and decayed channels), or
            "all" (ormas-monitor then also names silent channels; under DDP it does not repair
            them, because activations differ between ranks).
        check_every: optimizer steps between checks.
        thresholds: ormas-monitor's other `MonitorConfig` fields (patience, sigma, warmup, ...),
            checked by `MonitorConfig` itself; `config` is the resulting `MonitorConfig`.
        layers: fnmatch patterns on module names; only matching layers are monitored.
        verbose: rank 0 prints the monitor's own event lines as they happen.
        progress: rank 0 prints one line per check (step, loss, alarms, stuck channels, repairs).
        ray_report_lines: show Ray Train's own INFO line for every `ray.train.report` on every
            rank ("Reporting training result N: ...", with the whole metrics dict). Off by
            default: the console shows ray-ormas's progress, alarms, repairs and summary.
        report_every: also call `ray.train.report` every this many checks, on every rank
            (None: only with the user's own `ray_ormas.report` calls and once at the end).
            Each report is a barrier across workers, so keep it off the hot path.
        sync_timeout_s: how long a rank waits at a ray-ormas report for the other ranks
            before failing with an error that names the missing ranks (instead of hanging).
        auto_monitor: zero-change mode (worker/adoption.py): a loop that builds no monitor itself gets
            one on each model an optimizer steps, and a Lightning or Transformers trainer gets
            ormas-monitor's own callback. False: only `ray_ormas.monitor(...)` builds monitors.
    """

    repair: RepairMode = Field(
        default=False,
        description="false: watch only; true: repair certified, constant and decayed "
        "channels; `all`: see ormas-monitor",
    )
    check_every: int = Field(default=DEFAULT_CHECK_EVERY, ge=1, description="optimizer steps between checks")
    thresholds: dict[str, Any] = Field(
        default_factory=dict, description="other `ormas_monitor.MonitorConfig` fields (patience, sigma, warmup, ...)"
    )
    layers: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="fnmatch patterns of the layers to monitor (null: all)"
    )
    verbose: bool = Field(default=True, description="rank 0 prints ormas-monitor's own event lines")
    progress: bool = Field(default=True, description="rank 0 prints one line per check")
    ray_report_lines: bool = Field(
        default=False, description="show Ray Train's own log line for every report on every rank (its metrics dict)"
    )
    report_every: int | None = Field(
        default=None,
        ge=1,
        description="also report every N checks (a barrier each time; null: only the loop's own reports and the end)",
    )
    sync_timeout_s: float = Field(
        default=DEFAULT_SYNC_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="seconds ranks wait for each other at a report",
    )
    auto_monitor: bool = Field(
        default=True,
        description="monitor the models a loop trains without ray_ormas.monitor "
        "(optimizer step hooks; Lightning and Transformers callbacks)",
    )

    @field_validator("repair", mode="plain")
    @classmethod
    def _repair_mode(cls, value: Any) -> RepairMode:
        if value is True or value is False or value == "all":
            return value
        raise OptionError(
            f"repair must be False (watch only), True (repair certified, constant and decayed "
            f"channels) or 'all', got {value!r}"
        )

    @field_validator("layers")
    @classmethod
    def _patterns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not all(value):
            raise OptionError(f"layers must be fnmatch patterns such as 'conv*', got {list(value)!r}")
        return value

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "check_every" in value:
            raise OptionError("set check_every itself, not thresholds.check_every")
        try:
            MonitorConfig(**value)
        except TypeError as e:
            raise OptionError(f"{e}; the fields are {sorted(MonitorConfig().to_dict())}") from None
        return value

    @property
    def config(self) -> MonitorConfig:
        """ormas-monitor's `MonitorConfig`: `thresholds` and `check_every`."""
        return MonitorConfig(**self.thresholds, check_every=self.check_every)

    @classmethod
    def build(
        cls,
        *,
        repair: RepairMode = False,
        check_every: int | None = None,
        monitor_config: MonitorConfig | None = None,
        layers: str | Sequence[str] | None = None,
        verbose: bool = True,
        report_every: int | None = None,
        sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S,
        progress: bool = True,
        auto_monitor: bool = True,
        ray_report_lines: bool = False,
    ) -> MonitorSettings:
        """Settings from the trainer's keyword options: `monitor_config` gives the thresholds,
        `check_every` overrides its interval; an error is an `OptionError` naming the option."""
        if monitor_config is not None and not isinstance(monitor_config, MonitorConfig):
            raise OptionTypeError(
                f"monitor_config must be an ormas_monitor.MonitorConfig, got "
                f"{type(monitor_config).__name__}; build one with MonitorConfig(check_every=..., ...)"
            )
        defaults = MonitorConfig().to_dict()
        given = monitor_config.to_dict() if monitor_config is not None else defaults
        thresholds = {k: v for k, v in given.items() if k != "check_every" and v != defaults[k]}
        if check_every is None:
            check_every = given["check_every"]
        if isinstance(layers, str):
            layers = (layers,)
        elif isinstance(layers, list):
            layers = tuple(layers)
        return build(
            cls,
            "",
            repair=repair,
            check_every=check_every,
            thresholds=thresholds,
            layers=layers,
            verbose=verbose,
            progress=progress,
            ray_report_lines=ray_report_lines,
            report_every=report_every,
            sync_timeout_s=sync_timeout_s,
            auto_monitor=auto_monitor,
        )

    def with_shortcuts(self, *, repair: RepairMode = False, check_every: int | None = None) -> MonitorSettings:
        """These settings with the trainer's `repair=` / `check_every=` shortcuts: a shortcut sets a
        field these settings leave at its default; a field set both ways is an `OptionError`."""
        changes: dict[str, Any] = {}
        problems = []
        defaults = MonitorSettings()
        for name, value, unset in (("repair", repair, False), ("check_every", check_every, None)):
            if value is unset or value == unset:
                continue
            if getattr(self, name) != getattr(defaults, name):
                problems.append(
                    f"{name}: given twice, as {name}={value!r} and in MonitorSettings({name}="
                    f"{getattr(self, name)!r}); give it in one place"
                )
            changes[name] = value
        if problems:
            raise OptionError("; ".join(problems))
        return dataclasses.replace(self, **changes) if changes else self

    def monitor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `ormas_monitor.Monitor`, identical on every rank."""
        return {
            "repair": self.repair,
            "config": self.config,
            "layers": list(self.layers) if self.layers is not None else None,
            "verbose": self.verbose,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every setting, `check_every` and `thresholds` as the whole `MonitorConfig`
        (what the MLflow run's `monitor.*` params show)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("check_every", "thresholds")}
        out["layers"] = list(self.layers) if self.layers is not None else None
        out["config"] = self.config.to_dict()
        return out


@refuse_as_option_error
@dataclass(frozen=True, config=SETTINGS_CONFIG)
class BatchSize:
    """What a batch size means, said once (SR-Forge's guide asks it: per rank, or global?); the
    YAML config's `train.batch:` section.

    Attributes:
        size: the batch size, per rank or global as `per` says.
        per: "rank" (each rank loads `size` samples per micro-batch) or "global" (the whole
            optimizer step sees `size` samples: split over ranks and accumulation steps).
        accumulation: micro-batches per optimizer step (gradient accumulation), >= 1.

    The trainer checks it against `ScalingConfig.num_workers` on the driver: a global size that
    does not split evenly is refused there. With an elastic range `num_workers=(min, max)` a global
    size is split again at each world size (`elastic_splits`, the rule in docs/elastic.md).
    Inside the loop, `ray_ormas.batch_size()` is the per-rank micro-batch size; the effective
    batch (samples per optimizer step over all ranks) goes to MLflow params, every segment's
    `segment.json` and the reports (`ormas/effective_batch`).
    """

    size: int = Field(ge=1, description="samples per batch: per rank or global, as `per` says")
    per: Literal["rank", "global"] = Field(
        default="rank",
        description="`rank`: each rank loads `size`; `global`: the whole "
        "optimizer step sees `size`, split over ranks and "
        "accumulation steps",
    )
    accumulation: int = Field(default=1, ge=1, description="micro-batches per optimizer step (gradient accumulation)")

    def per_rank(self, world_size: int) -> int:
        """Samples each rank loads per micro-batch; a global size must split evenly."""
        if self.per == "rank":
            return self.size
        parts = world_size * self.accumulation
        if self.size % parts:
            lower, upper = self.size // parts * parts, -(-self.size // parts) * parts
            raise OptionError(
                f"a global batch of {self.size} does not split evenly over {world_size} workers x "
                f"{self.accumulation} accumulation steps ({parts} micro-batches per optimizer step): "
                f"use a multiple of {parts}, e.g. {lower or parts} or {upper}, or change the number "
                f"of workers (ScalingConfig.num_workers; scaling.workers in a YAML config)"
            )
        return self.size // parts

    def effective(self, world_size: int) -> int:
        """Samples per optimizer step, over every rank."""
        return self.per_rank(world_size) * world_size * self.accumulation

    def to_dict(self, world_size: int) -> dict[str, Any]:
        return {
            "size": self.size,
            "per": self.per,
            "accumulation": self.accumulation,
            "per_rank": self.per_rank(world_size),
            "effective": self.effective(world_size),
        }

    def elastic_splits(self, min_workers: int, max_workers: int, option: str) -> dict[int, dict[str, Any]]:
        """The batch at every world size of an elastic range, keyed by world size (the rule of
        docs/elastic.md). A per-rank size is the same at every size. A global size is split at
        each size; where a size cannot split it evenly, each rank loads the split rounded down
        (`per_rank = size // (world x accumulation)`), so that attempt trains on a smaller
        effective batch, which its segment records (`"rounded": true`). Refused: a range in
        which no size splits the global batch evenly, and a size at which a rank would load no
        sample. `option` names the range in the caller's words."""
        sizes = range(min_workers, max_workers + 1)
        if self.per == "rank":
            return {w: self.to_dict(w) for w in sizes}
        even = [w for w in sizes if self.size % (w * self.accumulation) == 0]
        if not even:
            raise OptionError(
                f"a global batch of {self.size} ({self.accumulation} accumulation step(s)) splits "
                f"evenly at no world size of {option} = [{min_workers}, {max_workers}]: every attempt "
                f"would train on a smaller batch than asked. Use a global batch that some size in the "
                f"range divides (e.g. {_multiple(self.size, max_workers * self.accumulation)}), or "
                f"per: rank"
            )
        too_many = [w for w in sizes if self.size // (w * self.accumulation) == 0]
        if too_many:
            raise OptionError(
                f"a global batch of {self.size} ({self.accumulation} accumulation step(s)) gives no "
                f"sample to each rank at {too_many[0]} workers, which {option} = [{min_workers}, "
                f"{max_workers}] allows: lower the maximum to {too_many[0] - 1}, or raise the batch"
            )
        out = {}
        for w in sizes:
            per_rank = self.size // (w * self.accumulation)
            out[w] = {
                "size": self.size,
                "per": self.per,
                "accumulation": self.accumulation,
                "per_rank": per_rank,
                "effective": per_rank * w * self.accumulation,
                "rounded": w not in even,
            }
        return out


def _multiple(size: int, parts: int) -> int:
    """The multiple of `parts` nearest `size` (at least `parts`)."""
    return max(parts, round(size / parts) * parts)
