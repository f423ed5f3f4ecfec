"""MLflow tracking: exactly one MLflow run per `fit()`, complete, with a correct final status.

Ray Train V2 has no MLflow integration (its old Tune `MLflowLoggerCallback` is rejected by V2's
RunConfig, and had duplicate runs after restarts, crashes on nested params, runs left RUNNING).
Here the run's lifecycle belongs to the driver and its contents to rank 0:

* driver, before launch (`RunTracker.start`): resolve the tracking URI (the setting, else
  `MLFLOW_TRACKING_URI`, else an embedded SQLite store inside the run directory), create the
  experiment and the run once (or continue `run_id`), log the params (train-loop config, monitor
  settings, strategy, scaling; nested dicts flattened to dotted keys, over-long values truncated
  and listed in a tag). A worker-group restart reuses the same run id: one run per fit.
* rank 0, while training (`TrackingSink`): ormas-monitor's own `MLflowSink` does the flattening
  and naming (`ormas/loss`, `ormas/grad_norm/<layer>`, `ormas/stuck_channels/<layer>`,
  `ormas/events/<event>`); ray-ormas points it at the fit's run through `MlflowClient.log_batch`
  instead of the fluent API's "active run" (whose lifecycle would end the run from a worker).
  One request per check, sent from a background thread so the check never waits on the tracker.
  At close, rank 0 flushes and uploads the record and reports under `ormas/`.
* driver, after `fit()` (`RunTracker.end`): FINISHED, FAILED (with the error in a tag) or
  KILLED (Ctrl-C), and the final checkpoint's location as a tag. Never left RUNNING.

A tracker outage never stops training: requests time out after `request_timeout_s` with no
retries, the first failure prints one warning, and ormas-monitor disables the sink and writes a
`sink_error` into the record. Credentials come only from the environment
(`MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_USERNAME` / `PASSWORD`, read by MLflow itself); they
are never logged, and a tracking URI is shown with any user:password removed.
"""
from __future__ import annotations

import math
import os
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

PARAM_VALUE_LIMIT = 6000        # MLflow's limit on a param value (characters)
PARAM_KEY_LIMIT = 250
PARAMS_PER_BATCH = 100
TAG_VALUE_LIMIT = 5000
DEFAULT_EXPERIMENT = "ray-ormas"
_SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME")
_USERINFO = re.compile(r"(?<=://)[^/@]+@")


@dataclass(frozen=True)
class MLflowSettings:
    """Where and how the fit's MLflow run is tracked.

    Args:
        tracking_uri: the tracking server or store. None: `MLFLOW_TRACKING_URI` if set, else an
            embedded SQLite store in the run directory (`<run dir>/mlflow/mlflow.db`).
        experiment_name: created if missing. Default "ray-ormas".
        run_name: default: the Ray run's name.
        tags: extra tags for the run (strings).
        run_id: continue this existing run instead of creating one.
        request_timeout_s: each tracking request gives up after this long, without retries.
    """

    tracking_uri: str | None = None
    experiment_name: str = DEFAULT_EXPERIMENT
    run_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    run_id: str | None = None
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("tracking_uri", "run_name", "run_id"):
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
                             "environment of the driver and the workers instead")


@dataclass(frozen=True)
class TrackingTarget:
    """What rank 0 needs to log into the fit's run; `error` is set when tracking failed at start."""
    tracking_uri: str
    run_id: str | None
    request_timeout_s: float
    error: str | None = None


def shown(uri: str) -> str:
    """A tracking URI safe to print: any user:password@ removed."""
    return _USERINFO.sub("***@", uri)


def quick_requests(timeout_s: float) -> None:
    """Make MLflow's HTTP requests in this process fail fast (no retries, a short timeout), unless
    the user set MLflow's own variables for that, which then win."""
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
    """Params within MLflow's limits, and the keys that had to be truncated, without secrets."""
    secrets = {os.environ[k] for k in _SECRET_ENV if len(os.environ.get(k) or "") >= 4}
    out, cut = {}, []
    for k, v in params.items():
        for s in secrets:
            v = v.replace(s, "***")
        key = k[:PARAM_KEY_LIMIT]
        if len(v) > PARAM_VALUE_LIMIT or len(k) > PARAM_KEY_LIMIT:
            cut.append(k)
            v = v[:PARAM_VALUE_LIMIT - 3] + "..." if len(v) > PARAM_VALUE_LIMIT else v
        out[key] = v
    return out, cut


class RunTracker:
    """The driver's side: one MLflow run per fit, from creation to its final status."""

    def __init__(self, target: TrackingTarget, client: Any) -> None:
        self.target = target
        self._client = client

    @property
    def run_id(self) -> str | None:
        return self.target.run_id

    @classmethod
    def start(cls, settings: MLflowSettings, run_dir: str | None, run_name: str,
              params: Mapping[str, Any]) -> RunTracker:
        """Create (or continue) the run and log its params; on an outage, warn once and go on untracked."""
        uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or _embedded_uri(run_dir)
        quick_requests(settings.request_timeout_s)
        try:
            from mlflow import MlflowClient
            from mlflow.entities import Param, RunTag
            client = MlflowClient(tracking_uri=uri)
            existing: dict[str, str] = {}
            if settings.run_id is not None:
                run = _existing_run(client, settings.run_id, uri)
                run_id, existing = run.info.run_id, dict(run.data.params)
                client.update_run(run_id, status="RUNNING")
            else:
                exp = client.get_experiment_by_name(settings.experiment_name)
                if exp is not None:
                    exp_id = exp.experiment_id
                else:
                    location = None if not uri.startswith("sqlite:") else \
                        Path(uri.removeprefix("sqlite:///")).resolve().parent.joinpath("artifacts").as_uri()
                    exp_id = client.create_experiment(settings.experiment_name, artifact_location=location)
                tags = {"ray_ormas.ray_run_name": run_name, **settings.tags}
                run_id = client.create_run(exp_id, run_name=settings.run_name or run_name, tags=tags).info.run_id
            values, cut = fit_params(flatten_params(params))
            # MLflow params are immutable: a continued run keeps the values it has; changes go in a tag.
            changed = [k for k, v in values.items() if k in existing and existing[k] != v]
            items = [Param(k, v) for k, v in values.items() if k not in existing]
            for i in range(0, len(items), PARAMS_PER_BATCH):
                client.log_batch(run_id, params=items[i:i + PARAMS_PER_BATCH])
            for tag, keys in (("ray_ormas.truncated_params", cut), ("ray_ormas.changed_params", changed)):
                if keys:
                    client.log_batch(run_id, tags=[RunTag(tag, ",".join(keys)[:TAG_VALUE_LIMIT])])
        except ValueError:
            raise
        except Exception as e:
            msg = f"{type(e).__name__}: {_first_line(e)}"
            print(f"[ray-ormas] warning: MLflow tracking at {shown(uri)} is unavailable ({msg}); training goes on "
                  f"without it, and the record notes it as a sink_error", file=sys.stderr, flush=True)
            return cls(TrackingTarget(uri, None, settings.request_timeout_s, error=msg), None)
        print(f"[ray-ormas] MLflow run {run_id} at {shown(uri)}", file=sys.stderr, flush=True)
        return cls(TrackingTarget(uri, run_id, settings.request_timeout_s), client)

    def end(self, status: str, error: BaseException | None = None, checkpoint_path: str | None = None) -> None:
        """Set the final status (FINISHED, FAILED or KILLED) and the closing tags; never raises."""
        if self._client is None or self.run_id is None:
            return
        try:
            from mlflow.entities import RunTag
            tags = [RunTag("ray_ormas.status", status)]
            if error is not None:
                tags.append(RunTag("ray_ormas.error", f"{type(error).__name__}: {error}"[:TAG_VALUE_LIMIT]))
            if checkpoint_path is not None:
                tags.append(RunTag("ray_ormas.final_checkpoint", checkpoint_path[:TAG_VALUE_LIMIT]))
            self._client.log_batch(self.run_id, tags=tags)
            self._client.set_terminated(self.run_id, status=status)
        except Exception as e:
            print(f"[ray-ormas] warning: could not set MLflow run {self.run_id} to {status} ({type(e).__name__}: "
                  f"{_first_line(e)}); the tracker is unreachable, so the run may show as RUNNING there",
                  file=sys.stderr, flush=True)


class _RunLogger:
    """Stands in for the `mlflow` module inside ormas-monitor's MLflowSink: the same two calls,
    sent with `MlflowClient.log_batch` to the fit's run (one request per call)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self._client = client
        self._run_id = run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_metric(self, key: str, value: float, step: int) -> None:
        self.log_metrics({key: value}, step)


class TrackingSink:
    """Rank 0's sink into the fit's MLflow run (ormas-monitor's MLflowSink, pointed at that run).

    Requests go out from a background thread, so a check never waits on the tracker. The first
    failure is raised at the next call: ray-ormas prints one warning and ormas-monitor records a
    `sink_error` and disables the sink. Training goes on; the record on disk stays complete.
    """

    QUEUE_LIMIT = 1000        # rows and events waiting for the tracker before it counts as failed

    def __init__(self, target: TrackingTarget, prefix: str) -> None:
        self.target = target
        self.failed = target.error is not None
        self._sink: Any = None
        self._error: BaseException | None = None
        self._settled = False          # a late failure was written to the record by `settle`
        if self.failed:
            return
        from mlflow import MlflowClient
        from ormas_monitor.integrations.sinks import MLflowSink
        quick_requests(target.request_timeout_s)
        self._client = MlflowClient(tracking_uri=target.tracking_uri)
        self._sink = MLflowSink(prefix=prefix)
        self._sink._mlflow = _RunLogger(self._client, target.run_id)
        self._queue: queue.Queue = queue.Queue(maxsize=self.QUEUE_LIMIT)
        threading.Thread(target=self._send, name="ray-ormas-mlflow", daemon=True).start()

    def __call__(self, kind: str, payload: dict) -> None:
        if self._settled:
            return
        if self._sink is None:
            raise ConnectionError(f"MLflow tracking was unavailable when the run started ({self.target.error})")
        if self._error is not None:
            self._fail()
        try:
            self._queue.put_nowait((kind, payload))
        except queue.Full:
            self._error = TimeoutError(f"MLflow logging fell {self.QUEUE_LIMIT} rows behind")
            self._fail()

    def _fail(self) -> None:
        self.failed = True
        e = self._error
        print(f"[ray-ormas] warning: MLflow logging to {shown(self.target.tracking_uri)} failed "
              f"({type(e).__name__}: {_first_line(e)}); training goes on, the record on disk is complete and "
              f"notes the failure", file=sys.stderr, flush=True)
        raise e

    def _send(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if self._error is None:
                    self._sink(kind, payload)
            except Exception as e:
                self._error = e
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for queued rows to reach the tracker; True if all did."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks and self._error is None

    def settle(self, diary: Any) -> None:
        """Before the record's `run_end`: wait (bounded) for queued rows to reach the tracker. If
        it failed after the last row was handed over, ormas-monitor never saw the failure, so it is
        written to the record here (`sink_error`, through ormas-monitor's own Diary)."""
        if self._sink is None or self.failed:
            return
        if self.flush(timeout_s=4 * self.target.request_timeout_s):
            return
        self.failed = self._settled = True
        why = f"{type(self._error).__name__}: {_first_line(self._error)}" if self._error else \
            "timed out sending the last rows"
        print(f"[ray-ormas] warning: MLflow logging to {shown(self.target.tracking_uri)} failed ({why}); training "
              f"went on, the record on disk is complete and notes the failure", file=sys.stderr, flush=True)
        try:
            if diary is not None:
                diary.write("sink_error", sink=repr(self), error=why)
        except Exception as e:          # the record's own failure is ormas-monitor's to report at close
            print(f"[ray-ormas] could not note the MLflow failure in the record ({type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)

    def upload(self, local_dir: Path, artifact_path: str) -> None:
        """Upload a record folder (diary, metrics, seal, reports) under `artifact_path`; never
        raises. Skipped once the tracker has failed (the record already says so)."""
        if self._sink is None or self.failed:
            return
        try:
            self._client.log_artifacts(self.target.run_id, str(local_dir), artifact_path=artifact_path)
        except Exception as e:
            print(f"[ray-ormas] warning: could not upload the record {local_dir} to MLflow ({type(e).__name__}: "
                  f"{_first_line(e)}); it stays on rank 0's node", file=sys.stderr, flush=True)

    def __repr__(self) -> str:
        return f"ray_ormas.TrackingSink({shown(self.target.tracking_uri)}, run {self.target.run_id})"


def _existing_run(client: Any, run_id: str, uri: str) -> Any:
    """The run to continue; a ValueError now (before launch) if the tracker says it does not exist."""
    from mlflow.exceptions import MlflowException
    try:
        return client.get_run(run_id)
    except MlflowException as e:
        if getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            raise ValueError(f"MLflowSettings.run_id={run_id!r} does not exist at {shown(uri)}; pass the id of an "
                             f"existing run, or run_id=None to start a new one") from None
        raise


def _embedded_uri(run_dir: str | None) -> str:
    base = Path(run_dir) if run_dir is not None else Path.home() / "ray_results" / "ray_ormas"
    store = base / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store.resolve() / 'mlflow.db'}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
