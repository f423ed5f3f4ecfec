"""Fleet health settings: frozen, validated on the driver before any worker starts.

    RayOrmasTrainer(loop, fleet=ray_ormas.FleetSettings(slow_score=0.6, slow_checks=5))
    RayOrmasTrainer(loop, fleet=False)          # nothing of fleet health runs

In a job config (`ray-ormas train`), the same names under `fleet:`. See docs/fleet-health.md for
what each number means. The NCCL hang detector is Ray Train's own (Ray 2.60, experimental): the
settings only switch it on through the environment variables Ray reads on the driver.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

HangDetector = Literal["off", "observe", "fail"]
HANG_DETECTOR_MODES: tuple[str, ...] = ("off", "observe", "fail")
HANG_DETECTOR_ENV = "RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR"
HANG_ACTION_ENV = "RAY_TRAIN_NCCL_RAS_ACTION"
HANG_CONFIRM_ENV = "RAY_TRAIN_NCCL_RAS_CONFIRM_DURATION_S"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class FleetSettings:
    """Every rank's facts at every check, turned into scores and alarms on the head node.

    Args:
        slow_score: a rank is slow at a check when its straggler score (the fleet's median busy
            time over its own, 1 = as fast as the others) is below this; 0 < slow_score < 1.
        slow_checks: ... and the straggler alarm fires when it has been slow for this many
            checks in a row (N); an int >= 1.
        min_excess: ... and only when its extra busy time is at least this fraction of the
            fleet's median step time, so that microsecond noise never alarms; 0 <= min_excess < 1.
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
    """

    slow_score: float = 0.5
    slow_checks: int = 3
    min_excess: float = 0.1
    divergence: bool = True
    ray_metrics: bool = True
    mlflow_ranks: int = 64
    nccl_hang_detector: HangDetector = "off"
    nccl_hang_confirm_s: float | None = None

    def __post_init__(self) -> None:
        if not _is_number(self.slow_score) or not 0 < self.slow_score < 1:
            raise ValueError(f"fleet slow_score must be a number between 0 and 1 (exclusive; a rank is slow when "
                             f"its straggler score is below it, e.g. 0.7), got {self.slow_score!r}")
        if not _is_int(self.slow_checks) or self.slow_checks < 1:
            raise ValueError(f"fleet slow_checks must be an int >= 1 (checks a rank must stay slow before the "
                             f"straggler alarm fires), got {self.slow_checks!r}")
        if not _is_number(self.min_excess) or not 0 <= self.min_excess < 1:
            raise ValueError(f"fleet min_excess must be a number in [0, 1) (the smallest extra busy time that "
                             f"counts as slow, as a fraction of the fleet's median step time), got "
                             f"{self.min_excess!r}")
        for flag in ("divergence", "ray_metrics"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"fleet {flag} must be True or False, got {getattr(self, flag)!r}")
        if not _is_int(self.mlflow_ranks) or self.mlflow_ranks < 0:
            raise ValueError(f"fleet mlflow_ranks must be an int >= 0, got {self.mlflow_ranks!r}")
        if self.nccl_hang_detector not in HANG_DETECTOR_MODES:
            raise ValueError(f"fleet nccl_hang_detector must be one of {', '.join(map(repr, HANG_DETECTOR_MODES))}, "
                             f"got {self.nccl_hang_detector!r}")
        t = self.nccl_hang_confirm_s
        if t is not None and (not _is_number(t) or t <= 0):
            raise ValueError(f"fleet nccl_hang_confirm_s must be None or a number of seconds > 0, got {t!r}")

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
