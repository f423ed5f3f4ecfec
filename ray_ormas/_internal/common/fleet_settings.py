"""Fleet health settings: frozen, validated on the driver before any worker starts.

    RayOrmasTrainer(loop, fleet=ray_ormas.FleetSettings(slow_score=0.6, slow_checks=5))
    RayOrmasTrainer(loop, fleet=False)          # nothing of fleet health runs

In a job config (`ray-ormas train`), the same names under `fleet:`. See docs/fleet-health.md for
what each number means, and "When the fleet acts" there for `actions`:

    FleetSettings(actions={"divergence": "reattempt", "hang": ["diagnose", "reattempt"]}, max_actions=3)
 The NCCL hang detector is Ray Train's own (Ray 2.60, experimental): the
settings only switch it on through the environment variables Ray reads on the driver.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Literal

from pydantic import Field, field_serializer, field_validator
from pydantic.dataclasses import dataclass

from ray_ormas._internal.common.fleet_policy import Policy, check_chain, policy_name, resolve_policy
from ray_ormas._internal.common.options import SETTINGS_CONFIG, refuse_as_option_error
from ray_ormas._internal.common.preflight_settings import PreflightSettings, preflight_settings
from ray_ormas.errors import OptionError

HangDetector = Literal["off", "observe", "fail"]
EvictScope = Literal["run", "cluster"]
ACTION_KINDS = ("straggler", "divergence", "nonfinite", "unreadable", "hang", "preflight")  # the alarms that can act

HANG_DETECTOR_ENV = "RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR"
HANG_ACTION_ENV = "RAY_TRAIN_NCCL_RAS_ACTION"
HANG_CONFIRM_ENV = "RAY_TRAIN_NCCL_RAS_CONFIRM_DURATION_S"


@refuse_as_option_error
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
        ray_metrics: export the fleet's gauges and alarm counters through `ray.util.metrics`.
        mlflow_ranks: log per-rank scores to MLflow for at most this many ranks (the fleet's
            minimum score and the alarms are logged at any size); an int >= 0.
        metrics_ranks: Ray's metrics carry per-rank series (a rank and node label each) for at
            most this many ranks (default 64); above it only the per-run summaries (quantiles of
            each per-rank value, the count of slow ranks, the worst rank), which are exported at
            every size: a bounded number of series per run, as Prometheus wants.
        record_ranks: the fleet record keeps every rank's row at every check for at most this
            many ranks (default 64). Above it, one summary row per check (quantiles, the slow,
            worst, non-finite and diverged ranks) and every rank's row only at the checks that
            matter: each attempt's first check, every `record_rows_every`-th check, and each
            check with an alarm and the 2 checks before and after it.
        record_rows_every: above `record_ranks`, every rank's row is kept at every this many
            checks (default 50); an int >= 1.
        nccl_hang_detector: Ray Train's NCCL hang detector: "off", "observe" (Ray logs a hang
            and captures stacks) or "fail" (Ray raises `NCCLHangError`, which lands in the fleet
            record and lets the failure policy restart the group). Needs NCCL (GPU workers).
        nccl_hang_confirm_s: seconds a hang must last before Ray confirms it (None: Ray's
            default, 600 s).
        hang_after_s: the head's own hang watch, on any backend: a `hang` alarm when no rank
            has reached a new check for this many seconds (None: 10 times the longest interval
            between checks so far, at least 120 s). Between an attempt's first check and its
            second (its warm-up) the bound is at least 120 s; see docs/fleet-health.md.
        actions: what an alarm does, by its kind (`straggler`, `divergence`, `nonfinite`,
            `unreadable`, `hang`, `preflight`): "log" (the default for every kind: name it), "reattempt"
            (restart the worker group from a checkpoint through Ray's failure path), "evict" (keep
            the run's later worker groups off the named ranks' nodes, then restart the group on
            other nodes; never the head node or the driver's; see `evict_scope`), "stop" (end the
            fit with `FleetStopError`), or ["diagnose", then] (capture the named ranks' Python
            stacks first, then the action after it, if any). At one check the most severe action
            is carried out (stop > evict > reattempt > diagnose > log); the other alarms of that
            check are recorded with the action they asked for.
        max_actions: at most this many actions per fit (an int >= 0); after that an alarm only
            logs, and its line says `bounded`. 0 keeps every alarm to logging while `actions`
            stays written down.
        evict_scope: what an evict touches. "run" (the default): the node is excluded from this
            run's later worker groups only (a label selector on the group's placement); every
            other run, job and Tune trial on it goes on as before. "cluster": Ray's GCS drains
            the node as a preemption, so nothing new is placed there by anyone, and Ray Train
            moves every other run with a worker on that node into its preempting state and
            restarts it (docs/fleet-health.md, "What an action can touch").
        max_evict_nodes: at most this many nodes per evict (an int >= 1; default 1). An evict
            whose ranks run on more nodes restarts the group instead (`reattempt`), and says so.
        policy: your own rule: a function (or "module:function") that receives a `FleetView` at
            every complete check and returns a `FleetAction` for named ranks, or None
            (docs/fleet-health.md, "Your own rule").
        preflight: the screen of every attempt's worker group before its first step (a
            `PreflightSettings`; True: its defaults; False: no screen): a matmul on every rank, a
            timed exchange between pairs of ranks and an all-reduce, your own probes; a rank
            slower than its peers on other nodes, or whose probe fails, is named in a `preflight`
            alarm, which `actions={"preflight": ...}` acts on (docs/fleet-health.md, "Before the
            first step").
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
    metrics_ranks: int = Field(
        default=64,
        ge=0,
        description="per-rank series in Ray's metrics for at most this many ranks; above it, only the per-run "
        "summaries (quantiles, slow ranks, the worst rank), which are always exported",
    )
    record_ranks: int = Field(
        default=64,
        ge=0,
        description="the fleet record keeps every rank's row at every check for at most this many ranks; above "
        "it, a summary per check and every rank's row at the checks that matter (around alarms, every "
        "record_rows_every checks)",
    )
    record_rows_every: int = Field(
        default=50, ge=1, description="above record_ranks ranks, every rank's row is kept at every this many checks"
    )
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
        "(null: 10x the longest interval between checks so far, at least 120 s; at least 120 s between "
        "an attempt's first check and its second)",
    )

    actions: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="what an alarm does, by kind: log (default), reattempt, evict, stop, or [diagnose, then]",
    )
    max_actions: int = Field(
        default=3,
        ge=0,
        description="at most this many actions per fit (0: every alarm only logs); then alarms only log",
    )
    evict_scope: EvictScope = Field(
        default="run",
        description="run: an evict keeps this run's later worker groups off the node; cluster: Ray drains the "
        "node for every run (other runs on it are preempted)",
    )
    max_evict_nodes: int = Field(
        default=1, ge=1, description="at most this many nodes per evict; an evict naming more restarts instead"
    )
    policy: Callable[..., Any] | None = Field(
        default=None,
        description="your own rule: 'module:function' called with a FleetView at every check, "
        "returning a FleetAction or null",
    )

    preflight: PreflightSettings = Field(
        default_factory=PreflightSettings,
        description="the screen of every attempt's worker group before its first step "
        "(`ray_ormas.PreflightSettings`; false: none)",
    )

    @field_validator("preflight", mode="before")
    @classmethod
    def _preflight_settings(cls, value: Any) -> Any:
        return preflight_settings(value)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_callable(cls, value: Any) -> Policy | None:
        return resolve_policy(value)

    @field_serializer("policy")
    def _policy_as_name(self, value: Any) -> str | None:
        return policy_name(value)  # "module:function", as a config gives it

    @field_validator("actions", mode="before")
    @classmethod
    def _action_chains(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise OptionError(f"must map alarm kinds to actions, e.g. {{'divergence': 'reattempt'}}, got {value!r}")
        return {kind: _chain(kind, given) for kind, given in value.items()}

    def action_for(self, kind: str) -> tuple[str, ...]:
        """The actions of an alarm of `kind`, in order: ("log",) unless `actions` says otherwise."""
        return self.actions.get(kind, ("log",))

    @property
    def evicts(self) -> bool:
        """Whether an alarm's action can evict (a policy may evict too: that is known only when it asks)."""
        return any("evict" in chain for chain in self.actions.values())

    @property
    def acts(self) -> bool:
        """Whether an alarm or the policy can do more than log."""
        return self.policy is not None or any(chain != ("log",) for chain in self.actions.values())

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
        return {**asdict(self), "policy": policy_name(self.policy), "preflight": self.preflight.to_dict()}

    def hang_detector_env(self) -> dict[str, str]:
        """The environment variables Ray Train reads on the driver to build its NCCL hang detector."""
        if self.nccl_hang_detector == "off":
            return {}
        env = {HANG_DETECTOR_ENV: "1", HANG_ACTION_ENV: self.nccl_hang_detector}
        if self.nccl_hang_confirm_s is not None:
            env[HANG_CONFIRM_ENV] = f"{self.nccl_hang_confirm_s:g}"
        return env


def _chain(kind: Any, given: Any) -> tuple[str, ...]:
    """One kind's actions as a tuple, checked: one action, or "diagnose" and then one."""
    if kind not in ACTION_KINDS:
        raise OptionError(f"{kind!r} is not an alarm kind that can act; the kinds are {', '.join(ACTION_KINDS)}")
    return check_chain(kind, given)
