"""The MLflow pieces both the head-node writer and `ray-ormas mlflow-sync` use.

Every `fit()` is exactly one MLflow run. Only the head node talks to MLflow: the run's writer
(`head/mlflow_writer.py`, in the job's MLflow host on the head node) creates the run, logs
what rank 0's monitor and the loop's reports produce, retries through outages, and closes the
run. The workers never import mlflow and never need to reach the tracking server or hold its
credentials.

This module holds what does not depend on where it runs:

* params: nested dicts flattened to dotted keys, cut to MLflow's limits, secrets masked.
* `loop_metrics`: which of a report's values MLflow can take (numbers; everything else skipped).
* `shown`: a tracking URI safe to print.
* `mlflow_host_idle_s`: the driver's `RAY_ORMAS_MLFLOW_HOST_IDLE_S`, checked.

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
from pathlib import Path
from typing import Any, Mapping

from ray_ormas._internal.common import keys
from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.common.mlflow_settings import USERINFO, MLflowSettings
from ray_ormas.errors import OptionError

logger = get_logger("ray_ormas.mlflow")

PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value (characters)
PARAM_KEY_LIMIT = 250
TAG_VALUE_LIMIT = 5000
EMBEDDED_HOME = "~/ray_results/ray_ormas"  # the embedded store when the run's storage is not local
_SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME")
# MLflow's own environment variables that the head-node writer needs from the driver.
MLFLOW_ENV = (
    "MLFLOW_TRACKING_URI",
    *_SECRET_ENV,
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_STORAGE_CONNECTION_STRING",
)
# The metric names MLflow accepts (its own rule, mlflow.utils.validation): a request with any other
# name is refused whole, so such a name is skipped here rather than sent.
_METRIC_NAME = re.compile(r"^[/\w.\- :]{1,250}$")


HOST_IDLE_ENV = "RAY_ORMAS_MLFLOW_HOST_IDLE_S"
DEFAULT_HOST_IDLE_S = 300.0


def mlflow_host_idle_s() -> float:
    """How long a job's MLflow host (head/mlflow_host.py) stays with no fit: the driver's
    `RAY_ORMAS_MLFLOW_HOST_IDLE_S` (seconds; 0: no host, each fit's ledger writes itself)."""
    text = os.environ.get(HOST_IDLE_ENV, "").strip()
    if not text:
        return DEFAULT_HOST_IDLE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise OptionError(
            f"{HOST_IDLE_ENV}={text!r} is not a number of seconds >= 0: unset it for the default "
            f"({DEFAULT_HOST_IDLE_S:.0f} s), or set 0 to keep each fit's MLflow writer in the fit's own ledger"
        )
    return value


def shown(uri: str) -> str:
    """A tracking URI safe to print: any user:password@ removed."""
    return USERINFO.sub("***@", uri)


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
        key = re.sub(r"[^/\w.\- :]", "_", k)[:PARAM_KEY_LIMIT]  # characters MLflow refuses become _
        if len(v) > PARAM_VALUE_LIMIT or len(k) > PARAM_KEY_LIMIT or key != k[:PARAM_KEY_LIMIT]:
            cut.append(k)
            v = v[: PARAM_VALUE_LIMIT - 3] + "..." if len(v) > PARAM_VALUE_LIMIT else v
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
        if not isinstance(k, str) or keys.is_ormas(k):
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
    return (
        bool(_METRIC_NAME.match(name))
        and posixpath.normpath(name) == name
        and not name.startswith(("/", ".."))
        and name != "."
    )


def _number(v: Any) -> float | None:
    if isinstance(v, numbers.Real):
        return float(v)
    item = getattr(v, "item", None)  # numpy scalars, one-element tensors and arrays
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
    """`MLflowSettings(run_id=...)`: an `OptionError` (a ValueError) on the driver, before anything
    starts, when the tracker says the run does not exist. Any other answer (an unreachable tracker,
    a refused permission) is named in one warning with the tracking URI and the run id, and left to
    the writer, which waits for the tracker and says what it meets."""
    if settings.run_id is None:
        return
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or embedded_uri(run_dir)
    quick_requests(settings.request_timeout_s)
    try:
        MlflowClient(tracking_uri=uri).get_run(settings.run_id)
    except MlflowException as e:
        if getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            raise OptionError(
                f"MLflowSettings.run_id={settings.run_id!r} does not exist at {shown(uri)}; pass the id "
                f"of an existing run, or run_id=None to start a new one"
            ) from None
        _could_not_check(uri, settings.run_id, e)
    except Exception as e:  # whatever the tracker's client raises: named, never fatal here
        _could_not_check(uri, settings.run_id, e)


def _could_not_check(uri: str, run_id: str, error: BaseException) -> None:
    logger.warning(
        f"could not check that MLflowSettings.run_id={run_id!r} exists at {shown(uri)}: "
        f"{type(error).__name__}: {first_line(error)}; training goes on, and the run is continued "
        f"once the tracker answers (check the id and your access to it)"
    )


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


def embedded_uri(run_dir: str | None) -> str:
    """The embedded SQLite store of a fit (`<run dir>/mlflow/mlflow.db`, or under EMBEDDED_HOME), created."""
    base = Path(run_dir) if run_dir is not None else Path(os.path.expanduser(EMBEDDED_HOME))
    store = base / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store.resolve() / 'mlflow.db'}"
