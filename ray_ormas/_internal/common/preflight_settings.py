"""The pre-flight screen's settings: frozen, validated on the driver before any worker starts.

    FleetSettings(preflight=PreflightSettings(factor=3, probes=["mypkg.checks:read_storage"]))
    FleetSettings(preflight=False)              # no screen
    FleetSettings(actions={"preflight": "evict"})   # what its alarm does (default: log)

In a job config, the same names under `fleet.preflight:`. What each probe measures and how the
ranks are compared: docs/fleet-health.md, "Before the first step". The probes themselves run on
every rank (worker/preflight.py), the comparison on the head node (fleet/preflight.py).
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import Field, field_serializer, field_validator
from pydantic.dataclasses import dataclass

from ray_ormas._internal.common.fleet_policy import policy_name, resolve_policy
from ray_ormas._internal.common.options import SETTINGS_CONFIG, refuse_as_option_error
from ray_ormas.errors import OptionError

CPU_MATMUL = 512  # the compute probe's matrix side on CPU, when not given
GPU_MATMUL = 4096  # ... and on a GPU


@refuse_as_option_error
@dataclass(frozen=True, config=SETTINGS_CONFIG)
class PreflightSettings:
    """A screen of every worker group before its first step (the YAML config's `fleet.preflight:`).

    Attributes:
        enabled: screen each attempt's group (on by default; `FleetSettings(preflight=False)` is
            the same as `PreflightSettings(enabled=False)`).
        factor: a rank whose compute or link time is more than this many times the median of the
            ranks on other nodes is named in a `preflight` alarm (> 1; default 2, as dlrover's
            network check).
        min_flops: a rank whose matmul runs at fewer FLOP/s is named too (None: no floor).
        min_bytes_per_s: a group whose all-reduce moves fewer bytes per second (bus bandwidth)
            is named too, every rank of it (None: no floor).
        matmul_size: the compute probe's matrix side (None: 512 on CPU, 4096 on a GPU).
        repeats: how many times each probe is timed: the fastest matmul and exchange count (a
            moment descheduled is noise, a slow node is slow every time), the all-reduce's
            median (longer, steadier screens on large clusters: more repeats).
        allreduce_mib: the size of the all-reduce and of each pair's exchange, in MiB.
        timeout_s: the longest a rank waits for the other ranks' results; a rank whose probes
            have not come by then is named as broken (it timed out).
        probes: your own probes: functions (or "module:function") called on every rank with no
            argument, each returning a dict of named facts (numbers or strings) for the record;
            one that raises is named as broken, with its error.
    """

    enabled: bool = Field(default=True, description="screen every attempt's worker group before its first step")
    factor: float = Field(
        default=2.0,
        gt=1,
        allow_inf_nan=False,
        description="a rank slower than this many times the median of the ranks on other nodes is named",
    )
    min_flops: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="a rank whose matmul runs at fewer FLOP/s is named"
    )
    min_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="a group whose all-reduce moves fewer bytes per second (bus bandwidth) is named",
    )
    matmul_size: int | None = Field(
        default=None, ge=16, le=32768, description="the compute probe's matrix side (null: 512 on CPU, 4096 on GPU)"
    )
    repeats: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="how many times each probe is timed (the fastest counts; the all-reduce's median)",
    )
    allreduce_mib: float = Field(
        default=1.0, gt=0, le=4096, allow_inf_nan=False, description="the all-reduce's and each exchange's size in MiB"
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="the longest a rank waits for the others' results; a rank not heard from by then is broken",
    )
    probes: tuple[Callable[[], Any], ...] = Field(
        default=(), description="your own probes: 'module:function' returning a dict of named facts"
    )

    @field_validator("probes", mode="before")
    @classmethod
    def _probe_callables(cls, value: Any) -> tuple[Callable[[], Any], ...]:
        given = [value] if isinstance(value, str) or callable(value) else value
        if not isinstance(given, (list, tuple)):
            raise OptionError(f"must be a list of functions or 'module:function' names, got {value!r}")
        probes: list[Callable[[], Any]] = []
        for probe in given:
            try:
                probes.append(resolve_policy(probe))  # type: ignore[arg-type]  # a probe, not a policy
            except OptionError as e:
                raise OptionError(str(e).replace("(view -> FleetAction or None)", "(no argument -> dict)")) from None
        names = [policy_name(p) or "probe" for p in probes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # the record keeps a probe's facts and failure under its name: one would hide the other
            raise OptionError(
                f"two probes are named {twice[0]!r} (module:qualname), and a probe's facts and failure are "
                "kept under its name: define each as a function of its own, or make one probe that "
                "returns all their facts"
            )
        return tuple(probes)

    @field_serializer("probes")
    def _probes_as_names(self, value: tuple[Callable[[], Any], ...]) -> list[str | None]:
        return [policy_name(p) for p in value]

    def matmul_side(self, on_gpu: bool) -> int:
        """The compute probe's matrix side on this device."""
        if self.matmul_size is not None:
            return self.matmul_size
        return GPU_MATMUL if on_gpu else CPU_MATMUL

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "factor": self.factor,
            "min_flops": self.min_flops,
            "min_bytes_per_s": self.min_bytes_per_s,
            "matmul_size": self.matmul_size,
            "repeats": self.repeats,
            "allreduce_mib": self.allreduce_mib,
            "timeout_s": self.timeout_s,
            "probes": [policy_name(p) for p in self.probes],
        }


def preflight_settings(value: Any) -> Any:
    """`FleetSettings.preflight` as given: True / None the defaults, False off, a dict its fields."""
    if value is True or value is None:
        return PreflightSettings()
    if value is False:
        return PreflightSettings(enabled=False)
    if isinstance(value, dict):
        return PreflightSettings(**value)
    return value
