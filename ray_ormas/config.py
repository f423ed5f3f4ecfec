"""Frozen, validated settings that travel from the driver to every worker.

`MonitorSettings` holds what ray-ormas needs to build the same `ormas_monitor.Monitor` on every
rank and to report its record: the repair mode, the monitor's thresholds (ormas-monitor's own
`MonitorConfig`, validated by ormas-monitor itself), the layer filter, and the reporting cadence.
Everything is checked on construction, on the driver, so a bad option fails before any Ray
worker starts.

    settings = MonitorSettings(repair=True, config=MonitorConfig(check_every=20))
    settings = MonitorSettings.build(repair=True, check_every=20)   # keyword shortcuts

`STRATEGIES` are the parallel strategies `ray.train.torch.prepare_model` knows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from ormas_monitor import MonitorConfig

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
RepairMode = bool | Literal["all"]

DEFAULT_MONITOR_NAME = "model"
DEFAULT_SYNC_TIMEOUT_S = 900.0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_strategy(strategy: Any) -> str:
    """`strategy` if it is one ray-ormas supports, else a ValueError that lists them."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(repr(s) for s in STRATEGIES)}, got {strategy!r}")
    return strategy


def check_monitor_name(name: Any) -> str:
    """A monitor name becomes a folder of the record: letters, digits, '-', '_' and '.' only."""
    if not isinstance(name, str) or not name or name.startswith(".") or \
            not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"monitor name must be a non-empty folder name of letters, digits, '-', '_' or '.', "
                         f"got {name!r}")
    return name


@dataclass(frozen=True)
class MonitorSettings:
    """How every rank builds and reports its monitor.

    Args:
        repair: False (watch only), True (repair certified, constant and decayed channels), or
            "all" (ormas-monitor then also names silent channels; under DDP it does not repair
            them, because activations differ between ranks).
        config: ormas-monitor's `MonitorConfig` (check_every, patience, repair_seed, ...).
        layers: fnmatch pattern(s) on module names; only matching layers are monitored.
        verbose: rank 0 prints the monitor's events as they happen.
        progress: rank 0 prints one line per check (step, loss, alarms, stuck channels, repairs).
        report_every: also call `ray.train.report` every this many checks, on every rank
            (None: only with the user's own `ray_ormas.report` calls and once at the end).
            Each report is a barrier across workers, so keep it off the hot path.
        sync_timeout_s: how long a rank waits at a ray-ormas report for the other ranks
            before failing with an error that names the missing ranks (instead of hanging).
    """

    repair: RepairMode = False
    config: MonitorConfig = field(default_factory=MonitorConfig)
    layers: tuple[str, ...] | None = None
    verbose: bool = True
    report_every: int | None = None
    sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S
    progress: bool = False

    def __post_init__(self) -> None:
        if self.repair is not False and self.repair is not True and self.repair != "all":
            raise ValueError(f"repair must be False (watch only), True (repair certified, constant and decayed "
                             f"channels) or 'all', got {self.repair!r}")
        if not isinstance(self.config, MonitorConfig):
            raise TypeError(f"monitor_config must be an ormas_monitor.MonitorConfig, got "
                            f"{type(self.config).__name__}; build one with MonitorConfig(check_every=..., ...)")
        if self.layers is not None:
            layers = (self.layers,) if isinstance(self.layers, str) else self.layers
            if not isinstance(layers, (tuple, list)) or not layers or \
                    not all(isinstance(p, str) and p for p in layers):
                raise ValueError(f"layers must be an fnmatch pattern such as 'conv*' or a non-empty list of them, "
                                 f"got {self.layers!r}")
            object.__setattr__(self, "layers", tuple(layers))
        for flag in ("verbose", "progress"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.report_every is not None and (not _is_int(self.report_every) or self.report_every < 1):
            raise ValueError(f"report_every must be None or an int >= 1 (checks between reports), "
                             f"got {self.report_every!r}")
        t = self.sync_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"sync_timeout_s must be a number of seconds > 0, got {t!r}")

    @classmethod
    def build(cls, *, repair: RepairMode = False, check_every: int | None = None,
              monitor_config: MonitorConfig | None = None, layers: str | Sequence[str] | None = None,
              verbose: bool = True, report_every: int | None = None,
              sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S, progress: bool = False) -> MonitorSettings:
        """Settings from the trainer's keyword options; `check_every` overrides the config's."""
        if monitor_config is not None and not isinstance(monitor_config, MonitorConfig):
            raise TypeError(f"monitor_config must be an ormas_monitor.MonitorConfig, got "
                            f"{type(monitor_config).__name__}")
        config = monitor_config or MonitorConfig()
        if check_every is not None:
            config = config.replace(check_every=check_every)     # MonitorConfig validates it
        return cls(repair=repair, config=config, layers=layers, verbose=verbose,  # type: ignore[arg-type]
                   report_every=report_every, sync_timeout_s=sync_timeout_s, progress=progress)

    def monitor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `ormas_monitor.Monitor`, identical on every rank."""
        return {"repair": self.repair, "config": self.config,
                "layers": list(self.layers) if self.layers is not None else None, "verbose": self.verbose}

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every setting (the MonitorConfig as its own dict)."""
        return {"repair": self.repair, "config": self.config.to_dict(),
                "layers": list(self.layers) if self.layers is not None else None, "verbose": self.verbose,
                "report_every": self.report_every, "sync_timeout_s": self.sync_timeout_s, "progress": self.progress}


@dataclass(frozen=True)
class BatchSize:
    """What a batch size means, said once (SR-Forge's guide asks it: per rank, or global?).

    Args:
        size: the batch size, per rank or global as `per` says.
        per: "rank" (each rank loads `size` samples per micro-batch) or "global" (the whole
            optimizer step sees `size` samples: split over ranks and accumulation steps).
        accumulation: micro-batches per optimizer step (gradient accumulation), >= 1.

    The trainer checks it against `ScalingConfig.num_workers` on the driver: a global size that
    does not split evenly is refused there. Inside the loop, `ray_ormas.batch_size()` is the
    per-rank micro-batch size; the effective batch (samples per optimizer step over all ranks)
    goes to MLflow params, every segment's `segment.json` and the reports (`ormas/effective_batch`).
    """

    size: int
    per: Literal["rank", "global"] = "rank"
    accumulation: int = 1

    def __post_init__(self) -> None:
        if not _is_int(self.size) or self.size < 1:
            raise ValueError(f"BatchSize.size must be an int >= 1, got {self.size!r}")
        if self.per not in ("rank", "global"):
            raise ValueError(f"BatchSize.per must be 'rank' or 'global', got {self.per!r}")
        if not _is_int(self.accumulation) or self.accumulation < 1:
            raise ValueError(f"BatchSize.accumulation must be an int >= 1 (micro-batches per optimizer step), "
                             f"got {self.accumulation!r}")

    def per_rank(self, world_size: int) -> int:
        """Samples each rank loads per micro-batch; a global size must split evenly."""
        if self.per == "rank":
            return self.size
        parts = world_size * self.accumulation
        if self.size % parts:
            lower, upper = self.size // parts * parts, -(-self.size // parts) * parts
            raise ValueError(f"a global batch of {self.size} does not split evenly over {world_size} workers x "
                             f"{self.accumulation} accumulation steps ({parts} micro-batches per optimizer step): "
                             f"use a multiple of {parts}, e.g. {lower or parts} or {upper}, or change num_workers")
        return self.size // parts

    def effective(self, world_size: int) -> int:
        """Samples per optimizer step, over every rank."""
        return self.per_rank(world_size) * world_size * self.accumulation

    def to_dict(self, world_size: int) -> dict[str, Any]:
        return {"size": self.size, "per": self.per, "accumulation": self.accumulation,
                "per_rank": self.per_rank(world_size), "effective": self.effective(world_size)}
