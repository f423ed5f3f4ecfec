"""MLflow settings and the pieces both the head-node writer and `ray-ormas mlflow-sync` use.

Every `fit()` is exactly one MLflow run. Only the head node talks to MLflow: the run's writer
(`mlflow_writer.py`, a thread in the run ledger actor on the head node) creates the run, logs
what rank 0's monitor and the loop's reports produce, retries through outages, and closes the
run. The workers never import mlflow and never need to reach the tracking server or hold its
credentials.

This module holds what does not depend on where it runs:

* `MLflowSettings`: frozen, validated on the driver.
* params: nested dicts flattened to dotted keys, cut to MLflow's limits, secrets masked.
* `loop_metrics`: which of a report's values MLflow can take (numbers; everything else skipped).
* `shown`: a tracking URI safe to print.

Credentials come only from the environment (`MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_USERNAME` /
`PASSWORD`, read by MLflow itself); the driver hands MLflow's variables to the head-node writer,
never to the workers. They are never logged, and a URI is shown with any user:password removed.
"""
from __future__ import annotations

import math
import numbers
import os
import posixpath
import re
from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from .options import SETTINGS_CONFIG

PARAM_VALUE_LIMIT = 6000        # MLflow's limit on a param value (characters)
PARAM_KEY_LIMIT = 250
TAG_VALUE_LIMIT = 5000
DEFAULT_EXPERIMENT = "ray-ormas"
CHECKPOINT_POLICIES = ("none", "last", "best", "all")
DEFAULT_MAX_PENDING = 100_000    # metric values held while the tracker is down (about 20 MB)
_SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME")
# MLflow's own environment variables that the head-node writer needs from the driver.
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", *_SECRET_ENV, "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH",
              "MLFLOW_TRACKING_CLIENT_CERT_PATH", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
              "MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_DEFAULT_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING")
_USERINFO = re.compile(r"(?<=://)[^/@]+@")
# The metric names MLflow accepts (its own rule, mlflow.utils.validation): a request with any other
# name is refused whole, so such a name is skipped here rather than sent.
_METRIC_NAME = re.compile(r"^[/\w.\- :]{1,250}$")


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

    enabled: bool = Field(True, description="track the run in MLflow")
    tracking_uri: str | None = Field(None, min_length=1, description="null: $MLFLOW_TRACKING_URI, else an embedded "
                                                                      "SQLite store in the run folder")
    experiment_name: str = Field(DEFAULT_EXPERIMENT, min_length=1, description="MLflow experiment name")
    run_name: str | None = Field(None, min_length=1, description="MLflow run name (null: the run's name)")
    tags: dict[str, str] = Field(default_factory=dict, description="extra MLflow tags")
    run_id: str | None = Field(None, min_length=1, description="continue this existing MLflow run instead of "
                                                              "creating one")
    request_timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False, description="each tracking request gives up "
                                     "after this long (the head node then holds the rows and retries)")
    log_checkpoints: Literal["none", "last", "best", "all"] = Field(
        "none", description="reported checkpoints uploaded as MLflow artifacts")
    checkpoint_metric: str | None = Field(None, min_length=1, description="the reported metric that ranks "
                                                                          "checkpoints for `log_checkpoints: best`")
    checkpoint_mode: Literal["min", "max"] = Field("min", description="`min` or `max` of `checkpoint_metric`")
    max_pending: int = Field(DEFAULT_MAX_PENDING, ge=1000, description="metric values held on the head node while "
                                                                       "MLflow is down (the record keeps all)")

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and _USERINFO.search(value):
            raise ValueError("the tracking URI must not carry credentials (user:password@); set "
                             "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN in the "
                             "driver's environment instead")
        return value

    @model_validator(mode="after")
    def _best_needs_a_metric(self) -> MLflowSettings:
        if self.log_checkpoints == "best" and self.checkpoint_metric is None:
            raise ValueError("log_checkpoints='best' needs checkpoint_metric='<a metric the loop reports with its "
                             "checkpoints>' (and checkpoint_mode='min' or 'max'); or use log_checkpoints='last' "
                             "or 'all'")
        return self


def shown(uri: str) -> str:
    """A tracking URI safe to print: any user:password@ removed."""
    return _USERINFO.sub("***@", uri)


def mlflow_environment() -> dict[str, str]:
    """MLflow's variables from this (the driver's) environment, for the head-node writer."""
    return {k: os.environ[k] for k in MLFLOW_ENV if os.environ.get(k)}


def quick_requests(timeout_s: float) -> None:
    """Make MLflow's HTTP requests in this process fail fast (no retries of its own, a short
    timeout: the writer retries itself), unless the user set MLflow's variables, which then win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(math.ceil(timeout_s)))))


def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts to dotted keys with string values; lists and other values as their str()."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten_params(v, key + "."))
        else:
            out[key] = str(v)
    return out


def fit_params(params: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Params within MLflow's limits, and the keys that had to be cut or renamed, without secrets."""
    secrets = {os.environ[k] for k in _SECRET_ENV if len(os.environ.get(k) or "") >= 4}
    out, cut = {}, []
    for k, v in params.items():
        for s in secrets:
            v = v.replace(s, "***")
        key = re.sub(r"[^/\w.\- :]", "_", k)[:PARAM_KEY_LIMIT]     # characters MLflow refuses become _
        if len(v) > PARAM_VALUE_LIMIT or len(k) > PARAM_KEY_LIMIT or key != k[:PARAM_KEY_LIMIT]:
            cut.append(k)
            v = v[:PARAM_VALUE_LIMIT - 3] + "..." if len(v) > PARAM_VALUE_LIMIT else v
        out[key] = v
    return out, cut


def loop_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """(the values MLflow can take as metrics, the keys skipped). Numbers (bool, int, float,
    numpy scalars, one-element tensors) are kept, NaN and Inf included (MLflow stores NaN and
    clips Inf to the largest double); strings, lists, dicts and None are skipped: they stay in
    Ray's `Result.metrics`, as are names MLflow refuses (see `metric_name_ok`). Keys starting
    with `ormas/` are ray-ormas's own and not loop metrics."""
    kept, skipped = {}, []
    for k, v in metrics.items():
        if not isinstance(k, str) or k.startswith("ormas/"):
            continue
        value = _number(v)
        if value is None or not metric_name_ok(k):
            skipped.append(k)
        else:
            kept[k] = value
    return kept, skipped


def metric_name_ok(name: str) -> bool:
    """MLflow takes the name: letters, digits, `_ - . : /` and spaces, at most 250 characters, and
    no path tricks (`a//b`, `./a`, `/a`, `a/..`)."""
    return bool(_METRIC_NAME.match(name)) and posixpath.normpath(name) == name and \
        not name.startswith(("/", "..")) and name != "."


def _number(v: Any) -> float | None:
    if isinstance(v, numbers.Real):
        return float(v)
    item = getattr(v, "item", None)             # numpy scalars, one-element tensors and arrays
    size = getattr(v, "size", 1)
    if callable(item) and (size == 1 or (callable(size) and getattr(v, "numel", lambda: 0)() == 1)):
        try:
            out = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return float(out) if isinstance(out, numbers.Real) else None
    return None


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def check_run_exists(settings: MLflowSettings, run_dir: str | None) -> None:
    """`MLflowSettings(run_id=...)`: a ValueError on the driver, before anything starts, when the
    tracker says the run does not exist. An unreachable tracker is left to the writer (it waits)."""
    if settings.run_id is None:
        return
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from .mlflow_writer import embedded_uri
    uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or embedded_uri(run_dir)
    quick_requests(settings.request_timeout_s)
    try:
        MlflowClient(tracking_uri=uri).get_run(settings.run_id)
    except MlflowException as e:
        if getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            raise ValueError(f"MLflowSettings.run_id={settings.run_id!r} does not exist at {shown(uri)}; pass the id "
                             f"of an existing run, or run_id=None to start a new one") from None
    except Exception:
        pass


def absolute_store_uri(uri: str | None) -> str | None:
    """A relative SQLite store (`sqlite:///runs.db`) or plain local path made absolute against this
    (the driver's) working directory: the head-node writer runs in a folder of Ray's own."""
    if uri is None:
        return None
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////") and ":memory:" not in uri:
        return "sqlite:///" + os.path.abspath(uri.removeprefix("sqlite:///"))
    if "://" not in uri and not uri.startswith(("databricks", "file:")):
        return os.path.abspath(os.path.expanduser(uri))
    return uri
