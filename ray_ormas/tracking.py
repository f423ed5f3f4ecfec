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
from dataclasses import dataclass, field
from typing import Any, Mapping

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


@dataclass(frozen=True)
class MLflowSettings:
    """Where and how the fit's MLflow run is tracked.

    Args:
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

    tracking_uri: str | None = None
    experiment_name: str = DEFAULT_EXPERIMENT
    run_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    run_id: str | None = None
    request_timeout_s: float = 5.0
    log_checkpoints: str = "none"
    checkpoint_metric: str | None = None
    checkpoint_mode: str = "min"
    max_pending: int = DEFAULT_MAX_PENDING

    def __post_init__(self) -> None:
        for name in ("tracking_uri", "run_name", "run_id", "checkpoint_metric"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"MLflowSettings.{name} must be a non-empty string or None, got {v!r}")
        if not isinstance(self.experiment_name, str) or not self.experiment_name:
            raise ValueError(f"MLflowSettings.experiment_name must be a non-empty string, got {self.experiment_name!r}")
        if not isinstance(self.tags, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in self.tags.items()):
            raise ValueError(f"MLflowSettings.tags must map strings to strings, got {self.tags!r}")
        object.__setattr__(self, "tags", dict(self.tags))
        t = self.request_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"MLflowSettings.request_timeout_s must be a number of seconds > 0, got {t!r}")
        if self.tracking_uri is not None and _USERINFO.search(self.tracking_uri):
            raise ValueError("MLflowSettings.tracking_uri must not carry credentials (user:password@); set "
                             "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN in the "
                             "driver's environment instead")
        if self.log_checkpoints not in CHECKPOINT_POLICIES:
            raise ValueError(f"MLflowSettings.log_checkpoints must be one of {', '.join(map(repr, CHECKPOINT_POLICIES))} "
                             f"(for 'best' also checkpoint_metric='<a reported metric>' and checkpoint_mode='min' or "
                             f"'max'), got {self.log_checkpoints!r}")
        if self.checkpoint_mode not in ("min", "max"):
            raise ValueError(f"MLflowSettings.checkpoint_mode must be 'min' or 'max', got {self.checkpoint_mode!r}")
        if self.log_checkpoints == "best" and self.checkpoint_metric is None:
            raise ValueError("MLflowSettings(log_checkpoints='best') needs checkpoint_metric='<a metric the loop "
                             "reports with its checkpoints>' (and checkpoint_mode='min' or 'max'); or use "
                             "log_checkpoints='last' or 'all'")
        m = self.max_pending
        if isinstance(m, bool) or not isinstance(m, int) or m < 1000:
            raise ValueError(f"MLflowSettings.max_pending must be an int >= 1000 (metric values held while the "
                             f"tracker is down), got {m!r}")


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
