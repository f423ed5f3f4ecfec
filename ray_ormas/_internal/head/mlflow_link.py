"""The ledger's MLflow writer: the fit's writer in the job's MLflow host (head/mlflow_host.py),
or, where that cannot be had, a `TrackingWriter` in the ledger's own process, as before the host.

`open_writer(spec)` is called in the ledger's constructor and never waits: it names the host,
gets or starts it, and asks it to open the fit's writer. Until the host has said yes, the calls
wait here in order; then they go to the host, never awaited. If the host cannot be started or
refuses the writer, the calls that waited are replayed into a writer of the ledger's own, so
nothing is lost and the fit is tracked as it was before the host existed. A host that dies
after taking the writer leaves the run's journal in storage: the fit's end says the run is
incomplete and `ray-ormas mlflow-sync` finishes it.

`RAY_ORMAS_MLFLOW_HOST_IDLE_S` on the driver (WriterSpec.host_idle_s): how long a host stays
with no fit (default 300 s); 0: no host, each fit's ledger writes itself.

Hooks relied on: `ray.get_runtime_context()` (job, node, runtime environment, the ledger's
own handle), named detached actors, `ObjectRef.future()`.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.head.mlflow_host import NAMESPACE, MLflowHost, host_name
from ray_ormas._internal.head.mlflow_writer import TrackingOutcome, TrackingWriter, WriterSpec, stage_for_upload
from ray_ormas._internal.tracking.values import first_line

logger = get_logger("ray_ormas.mlflow")
OPEN_TIMEOUT_S = 120.0  # a host that has not opened the writer by the fit's end never will


def open_writer(spec: WriterSpec) -> TrackingWriter | HostedWriter:
    """The fit's writer: in the job's MLflow host, else in this process."""
    if spec.host_idle_s <= 0:
        return TrackingWriter(spec)
    try:
        context = ray.get_runtime_context()
        node = context.get_node_id()
        host = MLflowHost.options(  # type: ignore[attr-defined]  # a Ray actor class
            name=host_name(spec, context.get_job_id(), node, dict(context.runtime_env or {})),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(spec.host_idle_s)
        opened = host.open.remote(spec, context.current_actor)
    except Exception as e:  # no host to be had: the ledger writes itself
        logger.debug("no MLflow host (%s: %s); the ledger writes itself", type(e).__name__, e)
        return TrackingWriter(spec)
    return HostedWriter(spec, host, opened)


class HostedWriter:
    """A `TrackingWriter`'s calls, sent to the fit's writer in the host (see the module docstring)."""

    def __init__(self, spec: WriterSpec, host: Any, opened: Any) -> None:
        self._spec = spec
        self._host = host
        self._opened: Future | None = opened.future()  # the host's answer to open(), until acted on
        self._waiting: list[tuple[str, tuple[Any, ...]]] = []  # calls made before it was known
        self._local: TrackingWriter | None = None  # the fallback, once the host said no
        self._lock = threading.Lock()  # the ledger calls from its event loop and from threads
        self._staged: list[Path] = []  # checkpoint copies made here (the writer removes them)
        self._sent = 0  # calls sent to the host: the next one's number
        opened_future = self._opened
        opened_future.add_done_callback(lambda _: self._settle_now())  # what waited goes at once

    def _settle_now(self) -> None:
        with self._lock:
            self._settle(wait_s=0)

    def rows(self, prefix: str, offset: int, kind: str, payload: dict[str, Any]) -> None:
        self._send("rows", (prefix, offset, kind, payload))

    def fleet(self, entries: list[Any]) -> None:
        self._send("fleet", (entries,))

    def attempt_started(self, attempt: int, offset: int, world_size: int | None = None) -> None:
        self._send("attempt_started", (attempt, offset, world_size))

    def loop_report(self, metrics: dict[str, Any], step: int | None, checkpoint: Any = None) -> None:
        # The copy for log_checkpoints="all" is made here, now: by the time the host takes the
        # call, Ray may have deleted the checkpoint (num_to_keep). The host is on this node.
        staged = stage_for_upload(self._spec.settings, checkpoint)
        if staged is not None:
            self._staged.append(staged)
        self._send("loop_report", (metrics, step, checkpoint, staged))

    def attempt_ended(self) -> None:
        self._send("attempt_ended", ())

    def finish(self, status: str, error: str | None, final_checkpoint: str | None) -> TrackingOutcome:
        """The writer's last sync, in the host (after every earlier call has run there) or here."""
        with self._lock:
            self._settle(wait_s=OPEN_TIMEOUT_S)
            local = self._local
        if local is not None:
            return local.finish(status, error, final_checkpoint)
        try:
            # Futures, not ray.get: the ledger is an async actor (this runs on one of its threads).
            self._host.flush.remote(self._spec.fit_id, self._sent, OPEN_TIMEOUT_S).future().result()
            outcome = self._host.finish.remote(self._spec.fit_id, status, error, final_checkpoint).future().result()
        except Exception as e:  # the host died with the writer: the journal in storage remains
            return self._incomplete(f"the MLflow host process was lost ({type(e).__name__}: {first_line(e)})")
        if outcome is None:
            return self._incomplete("the MLflow host had dropped this fit's writer (its ledger did not answer)")
        return outcome

    def _incomplete(self, why: str) -> TrackingOutcome:
        for staged in self._staged:  # the writer that would have removed them is gone
            shutil.rmtree(staged, ignore_errors=True)
        return TrackingOutcome(None, self._spec.settings.tracking_uri, complete=False, error=why)

    def _send(self, method: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._settle(wait_s=0)
            if self._local is not None:
                getattr(self._local, method)(*args)
            elif self._opened is not None:
                self._waiting.append((method, args))
            else:
                self._to_host(method, args)

    def _to_host(self, method: str, args: tuple[Any, ...]) -> None:
        """Send one call, numbered (the host applies them in this order). Called under `_lock`."""
        self._host.call.remote(self._spec.fit_id, self._sent, method, args)
        self._sent += 1

    def _settle(self, wait_s: float) -> None:
        """If the host's answer to open() is in (or comes within `wait_s`), act on it: send what
        waited to the host, or replay it into a writer of this process. Called under `_lock`."""
        if self._opened is None or self._local is not None:
            return
        if wait_s <= 0 and not self._opened.done():
            return  # never blocks the ledger's event loop
        try:
            self._opened.result(timeout=wait_s)
        except Exception as e:  # refused, the host lost, or no answer in `wait_s`
            logger.warning(
                "the job's MLflow host could not take this fit (%s: %s); its ledger writes to MLflow itself",
                type(e).__name__,
                first_line(e),
            )
            self._host.abandon.remote(self._spec.fit_id)  # should the host open it after all
            self._local = TrackingWriter(self._spec)
            for method, args in self._waiting:
                getattr(self._local, method)(*args)
        else:
            for method, args in self._waiting:
                self._to_host(method, args)
        self._opened = None
        self._waiting = []
