"""Fleet health settings: frozen, validated on the driver before any worker starts.

    RayOrmasTrainer(loop, fleet=ray_ormas.FleetSettings(slow_score=0.6, slow_checks=5))
    RayOrmasTrainer(loop, fleet=False)          # nothing of fleet health runs

In a job config (`ray-ormas train`), the same names under `fleet:`. See docs/fleet-health.md for
what each number means. The NCCL hang detector is Ray Train's own (Ray 2.60, experimental): the
settings only switch it on through the environment variables Ray reads on the driver.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from ray_ormas._internal.common.options import SETTINGS_CONFIG
from ray_ormas.errors import OptionError

HangDetector = Literal["off", "observe", "fail"]
HANG_DETECTOR_ENV = "RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR"
HANG_ACTION_ENV = "RAY_TRAIN_NCCL_RAS_ACTION"
HANG_CONFIRM_ENV = "RAY_TRAIN_NCCL_RAS_CONFIRM_DURATION_S"


@dataclass(frozen=True, config=SETTINGS_CONFIG)
class FleetSettings:
    """Every rank's facts at every check, turned into scores and alarms on the head node (the
    YAML config's `fleet:` section).

    Attributes:
        enabled: fleet health at all (`RayOrmasTrainer(fleet=False)` is the same as
            `FleetSettings(enabled=False)`); it is off by itself with a single worker.
        slow_score: a rank is slow at a check when its straggler score (the fleet's median busy
            time over its own, 1 = as fast as the others) is below this; 0 < slow_score < 1.
        slow_checks: ... and the straggler alarm fires when it has been slow for this many
            checks in a row (N); the episode ends after N checks in a row that are not slow.
        min_excess: ... and only when its extra busy time is at least this fraction of the
            fleet's median step time: 0.2, the default, names a rank that makes every step of the
            fleet at least a fifth longer, and not a millisecond of scheduler noise on a fast
            step; 0 <= min_excess < 1.
        divergence: compare the DDP replicas' parameter digests at every check (under FSDP each
            rank holds other shards, so there is nothing to compare and this is skipped).
        ray_metrics: export per-rank gauges and alarm counters through `ray.util.metrics`.
        mlflow_ranks: log per-rank scores to MLflow for at most this many ranks (the fleet's
            minimum score and the alarms are logged at any size); an int >= 0.
        nccl_hang_detector: Ray Train's NCCL hang detector: "off", "observe" (Ray logs a hang
            and captures stacks) or "fail" (Ray raises `NCCLHangError`, which lands in the fleet
            record and lets the failure policy restart the group). Needs NCCL (GPU workers).
        nccl_hang_confirm_s: seconds a hang must last before Ray confirms it (None: Ray's
            default, 600 s).
        hang_after_s: the head's own hang watch, on any backend: a `hang` alarm when no rank
            has reached a new check for this many seconds (None: 10 times the longest interval
            between checks so far, at least 120 s; see docs/fleet-health.md).
    """

    enabled: bool = Field(
        default=True,
        description="fleet health (with more than one worker): every rank's timings, loss, "
        "non-finite values and parameter digest at every check",
    )
    slow_score: float = Field(
        default=0.5, gt=0, lt=1, description="a rank is slow when its straggler score is below this"
    )
    slow_checks: int = Field(
        default=3,
        ge=1,
        description="slow checks in a row before the straggler alarm (and checks in a row not slow before it ends)",
    )
    min_excess: float = Field(
        default=0.2,
        ge=0,
        lt=1,
        description="the least extra busy time that counts as slow, as a fraction of the fleet's median step time",
    )
    divergence: bool = Field(default=True, description="compare the DDP replicas' parameter digests at every check")
    ray_metrics: bool = Field(
        default=True, description="per-rank gauges and alarm counters in Ray's metrics (Prometheus)"
    )
    mlflow_ranks: int = Field(default=64, ge=0, description="log per-rank scores to MLflow for at most this many ranks")
    nccl_hang_detector: HangDetector = Field(
        default="off",
        description="Ray Train's NCCL hang detector (GPU workers): "
        "`fail` ends the group with NCCLHangError, recorded "
        "in the fleet record",
    )
    nccl_hang_confirm_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="seconds a hang lasts before Ray confirms it (null: Ray's default, 600)",
    )
    hang_after_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="a `hang` alarm when no rank has reached a new check for this many seconds "
        "(null: 10x the longest interval between checks so far, at least 120 s)",
    )

    @field_validator("nccl_hang_detector", mode="before")
    @classmethod
    def _yaml_off_is_false(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false and `on` as true.
        if value is False:
            return "off"
        if value is True:
            raise OptionError("`on` is not a mode: use 'observe' (log a hang) or 'fail' (end the group)")
        return value

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hang_detector_env(self) -> dict[str, str]:
        """The environment variables Ray Train reads on the driver to build its NCCL hang detector."""
        if self.nccl_hang_detector == "off":
            return {}
        env = {HANG_DETECTOR_ENV: "1", HANG_ACTION_ENV: self.nccl_hang_detector}
        if self.nccl_hang_confirm_s is not None:
            env[HANG_CONFIRM_ENV] = f"{self.nccl_hang_confirm_s:g}"
        return env
