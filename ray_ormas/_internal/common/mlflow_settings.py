"""MLflow settings: frozen, validated on the driver (the YAML config's `mlflow:` section too).

Plain pydantic, no mlflow: the driver validates them before anything starts, and the run's
MLflow writer on the head node (head/mlflow_writer.py) is built from them. Credentials never
travel in them: they come only from the environment (see tracking/values.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from ray_ormas._internal.common.options import SETTINGS_CONFIG, refuse_as_option_error
from ray_ormas.errors import OptionError

DEFAULT_EXPERIMENT = "ray-ormas"
DEFAULT_MAX_PENDING = 100_000  # metric values held while the tracker is down (about 20 MB)
USERINFO = re.compile(r"(?<=://)[^/@]+@")  # user:password@ in a URI


@refuse_as_option_error
@dataclass(frozen=True, config=SETTINGS_CONFIG)
class MLflowSettings:
    """Where and how the fit's MLflow run is tracked (the YAML config's `mlflow:` section).

    Attributes:
        enabled: track the run in MLflow (`RayOrmasTrainer(mlflow=False)` is the same as
            `MLflowSettings(enabled=False)`).
        tracking_uri: the tracking server or store. None: `MLFLOW_TRACKING_URI` if set (on the
            driver), else an embedded SQLite store in the run directory (`<run dir>/mlflow/mlflow.db`).
        experiment_name: created if missing. Default "ray-ormas".
        run_name: default: the Ray run's name.
        tags: extra tags for the run (strings).
        run_id: continue this existing run instead of creating one (checked on the driver).
        request_timeout_s: each tracking request gives up after this long; the writer then
            holds the rows and tries again later (see `max_pending`).
        log_checkpoints: which reported checkpoints are uploaded as artifacts: "none" (default),
            "last" (the fit's final checkpoint), "best" (by `checkpoint_metric` and
            `checkpoint_mode`), or "all" (each as it is reported).
        checkpoint_metric: the reported metric that ranks checkpoints for "best".
        checkpoint_mode: "min" (default) or "max".
        max_pending: metric values held in memory on the head node while the tracker is down;
            beyond it the oldest are dropped from memory and sent from the record (and the
            loop metrics' journal) when the tracker answers again.
    """

    enabled: bool = Field(default=True, description="track the run in MLflow")
    tracking_uri: str | None = Field(
        default=None,
        min_length=1,
        description="null: $MLFLOW_TRACKING_URI, else an embedded SQLite store in the run folder",
    )
    experiment_name: str = Field(default=DEFAULT_EXPERIMENT, min_length=1, description="MLflow experiment name")
    run_name: str | None = Field(default=None, min_length=1, description="MLflow run name (null: the run's name)")
    tags: dict[str, str] = Field(default_factory=dict, description="extra MLflow tags")
    run_id: str | None = Field(
        default=None, min_length=1, description="continue this existing MLflow run instead of creating one"
    )
    request_timeout_s: float = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="each tracking request gives up after this long (the head node then holds the rows and retries)",
    )
    log_checkpoints: Literal["none", "last", "best", "all"] = Field(
        default="none", description="reported checkpoints uploaded as MLflow artifacts"
    )
    checkpoint_metric: str | None = Field(
        default=None, min_length=1, description="the reported metric that ranks checkpoints for `log_checkpoints: best`"
    )
    checkpoint_mode: Literal["min", "max"] = Field(default="min", description="`min` or `max` of `checkpoint_metric`")
    max_pending: int = Field(
        default=DEFAULT_MAX_PENDING,
        ge=1000,
        description="metric values held on the head node while MLflow is down (the record keeps all)",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and USERINFO.search(value):
            raise OptionError(
                "the tracking URI must not carry credentials (user:password@); set "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN in the "
                "driver's environment instead"
            )
        return value

    @model_validator(mode="after")
    def _best_needs_a_metric(self) -> MLflowSettings:
        if self.log_checkpoints == "best" and self.checkpoint_metric is None:
            raise ValueError(
                "log_checkpoints='best' needs checkpoint_metric='<a metric the loop reports with its "
                "checkpoints>' (and checkpoint_mode='min' or 'max'); or use log_checkpoints='last' "
                "or 'all'"
            )
        return self
