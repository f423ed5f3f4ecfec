"""A Ray job's MLflow host: one long-lived actor on the head node that keeps MLflow imported and
holds the `TrackingWriter` (head/mlflow_writer.py) of each of the job's tracked fits.

MLflow's client, its SQL store and ormas-monitor's sink take about 4 CPU-seconds to import. A
writer living in each fit's own ledger paid them on every fit, while the fit's workers started on
the same cores; here the job's first tracked fit pays them and the later ones (a script's next
`fit()`, a Tune sweep's trials) find them imported. The ledgers reach it through
head/mlflow_link.py, which falls back to a writer of the ledger's own whenever it cannot.

    ledger   open(spec, ledger)           the fit's writer is built here
    ledger   call(fit_id, seq, method, ...)  rows, fleet entries, reports, attempts: never awaited
    ledger   flush(fit_id, calls)         returns once the fit's first `calls` calls have run
    ledger   finish(fit_id, ...)          the writer's last sync; the writer is dropped
    ledger   abandon(fit_id)              the writer is dropped, the run left as it is

Ordering: the ledger numbers its calls and the host applies them in that order, after `open`
(Ray runs a call as soon as its arguments are ready, and a large one waits in the object store),
on the actor's default concurrency group, one thread. `flush` and `finish` have a group of
their own, so one fit's last sync (seconds, or a tracker's timeouts) never holds up the other
fits' calls, and `flush` can wait for a call still on its way.

Its name is keyed by what a writer's process shares (ray-ormas's version and location, the Ray
job, the node, the job's runtime environment, MLflow's variables from the driver, the request
timeout), so two fits share a host only where one process could serve both as well as its own:
the fits of one driver (a script's, a Tune sweep's trials, `ray-ormas train`'s), never those of
two jobs, whose consoles each show only their own job's log lines. It watches each
fit's ledger and drops the writer of a ledger that died (as a writer inside it would have died
with it: the journal stays, `ray-ormas mlflow-sync` finishes the run). With no fit for
`idle_s` it ends itself.

Hooks relied on: named detached actors (`get_if_exists`), concurrency groups, `ray.kill`,
`ray.get_runtime_context().current_actor`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from ray_ormas._internal.common.logs import get_logger

if TYPE_CHECKING:
    from ray_ormas._internal.head.mlflow_writer import TrackingOutcome, TrackingWriter, WriterSpec

logger = get_logger("ray_ormas.mlflow")

NAMESPACE = "ray_ormas"
FORWARDED = frozenset({"rows", "fleet", "attempt_started", "loop_report", "attempt_ended"})
WATCH_EVERY_S = 10.0  # how often the host looks at its ledgers and at its own idleness
LEDGER_ANSWER_S = 30.0  # a ledger that does not answer within this is busy, not dead


def host_name(spec: WriterSpec, job_id: str, node_id: str, runtime_env: dict[str, Any]) -> str:
    """The name of the host that may hold `spec`'s writer for job `job_id` on node `node_id`."""
    shared = {
        "version": _version(),
        "package": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "job": job_id,  # a job's driver sees the logs of its own job's actors only
        "node": node_id,
        "runtime_env": runtime_env,
        "environment": sorted(spec.environment.items()),
        "request_timeout_s": spec.settings.request_timeout_s,
    }
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"ray-ormas-mlflow-{digest}"


@dataclass
class _Fit:
    """One fit's writer in the host, and its ledger's calls in their order."""

    writer: TrackingWriter | None = None  # None until open() has run
    ledger: Any = None
    applied: int = 0  # the calls applied so far (the next one's number)
    early: dict[int, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)  # arrived before their turn


@ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={"finish": 16})
class MLflowHost:
    """The MLflow writers of one Ray job's tracked fits (see the module docstring)."""

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._fits: dict[str, _Fit] = {}
        self._gone: set[str] = set()  # fits dropped: a late open() or call() of theirs is passed over
        self._served = 0
        self._idle_since = time.monotonic()
        self._lock = threading.Lock()  # `_fits`; never held while a writer does I/O
        self._applied = threading.Condition(self._lock)
        self._me = ray.get_runtime_context().current_actor
        threading.Thread(target=self._watch, name="ray-ormas-mlflow-host-watch", daemon=True).start()

    def open(self, spec: WriterSpec, ledger: Any) -> None:
        """Build the fit's writer (its constructor writes the journal), then apply the fit's calls
        that arrived before it."""
        from ray_ormas._internal.head.mlflow_writer import TrackingWriter

        with self._lock:
            if spec.fit_id in self._gone:  # abandoned before it opened (its ledger writes itself)
                return
        writer = TrackingWriter(spec)
        with self._lock:
            fit = self._fits.setdefault(spec.fit_id, _Fit())
            fit.writer, fit.ledger = writer, ledger
            self._served += 1
        self._apply(spec.fit_id)

    def call(self, fit_id: str, seq: int, method: str, args: tuple[Any, ...]) -> None:
        """The fit's `seq`-th writer call (`FORWARDED`), applied in the order the ledger numbered
        them: Ray may run a call whose arguments wait in the object store after a later one."""
        if method not in FORWARDED:
            logger.error("the MLflow host was asked for %r, which is not a writer call; passed over", method)
            method, args = "", ()
        with self._lock:
            if fit_id in self._gone:
                return
            self._fits.setdefault(fit_id, _Fit()).early[seq] = (method, args)
        self._apply(fit_id)

    @ray.method(concurrency_group="finish")
    def flush(self, fit_id: str, calls: int, timeout_s: float) -> bool:
        """Wait until the fit's first `calls` calls have been applied (at most `timeout_s`);
        whether its writer is here."""
        with self._applied:
            self._applied.wait_for(lambda: self._caught_up(fit_id, calls), timeout=timeout_s)
            fit = self._fits.get(fit_id)
            return fit is not None and fit.writer is not None

    def abandon(self, fit_id: str) -> None:
        """Drop the fit's writer without ending its run (its ledger writes itself, or is gone)."""
        with self._lock:
            fit = self._fits.get(fit_id)
        if fit is not None and fit.writer is not None:
            fit.writer.abandon()
        self._drop(fit_id)

    @ray.method(concurrency_group="finish")
    def finish(
        self, fit_id: str, status: str, error: str | None, final_checkpoint: str | None
    ) -> TrackingOutcome | None:
        """The fit ended: its writer's last sync, then the writer is dropped (None: it was dropped
        already, its ledger taken for gone)."""
        with self._lock:
            fit = self._fits.get(fit_id)
        if fit is None or fit.writer is None:
            return None
        try:
            return fit.writer.finish(status, error, final_checkpoint)
        finally:
            self._drop(fit_id)

    @ray.method(concurrency_group="finish")
    def served(self) -> dict[str, Any]:
        """This process's pid, how many fits it has held a writer for, and which it holds now."""
        with self._lock:
            open_fits = sorted(k for k, f in self._fits.items() if f.writer is not None)
            return {"pid": os.getpid(), "served": self._served, "open": open_fits}

    def _apply(self, fit_id: str) -> None:
        """Apply the fit's calls whose turn has come (only the default group's one thread applies)."""
        while True:
            with self._lock:
                fit = self._fits.get(fit_id)
                if fit is None or fit.writer is None or fit.applied not in fit.early:
                    self._applied.notify_all()
                    return
                method, args = fit.early.pop(fit.applied)
                writer = fit.writer
            try:
                if method:
                    getattr(writer, method)(*args)
            except Exception as e:  # never stalls the fit's later calls; the record keeps it all
                logger.error("the MLflow writer's %s failed (%s: %s); passed over", method, type(e).__name__, e)
            finally:
                with self._lock:
                    fit.applied += 1

    def _caught_up(self, fit_id: str, calls: int) -> bool:
        fit = self._fits.get(fit_id)
        return fit is None or (fit.writer is not None and fit.applied >= calls)

    def _drop(self, fit_id: str) -> None:
        with self._lock:
            self._fits.pop(fit_id, None)
            self._gone.add(fit_id)
            if not any(f.writer is not None for f in self._fits.values()):
                self._idle_since = time.monotonic()
            self._applied.notify_all()

    def _watch(self) -> None:
        while True:
            time.sleep(min(WATCH_EVERY_S, max(self._idle_s, 0.5)))
            with self._lock:
                ledgers = {k: f.ledger for k, f in self._fits.items() if f.writer is not None}
                idle = not ledgers and time.monotonic() - self._idle_since >= self._idle_s
            if idle:
                logger.info("the MLflow host has had no fit for %.0f s; it ends", self._idle_s)
                ray.kill(self._me, no_restart=True)
                return
            for fit_id, ledger in ledgers.items():
                if not _answers(ledger):
                    self.abandon(fit_id)
                    logger.warning(
                        "the ledger of fit %s is gone without ending its MLflow run; its journal in the "
                        "run's storage keeps the rest (`ray-ormas mlflow-sync RUN` finishes the run)",
                        fit_id,
                    )


def _version() -> str:
    """ray-ormas's installed version (not `ray_ormas.__version__`: the head side imports no public module)."""
    try:
        return importlib.metadata.version("ray-ormas")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _answers(ledger: Any) -> bool:
    """False only when the ledger's actor is dead (a slow answer is a busy ledger)."""
    try:
        ray.get(ledger.alive.remote(), timeout=LEDGER_ANSWER_S)
    except ray.exceptions.GetTimeoutError:
        return True
    except ray.exceptions.RayActorError:
        return False
    except Exception:  # anything else is not proof of death
        return True
    return True
