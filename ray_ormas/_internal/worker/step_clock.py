"""Rank 0's clock of its main monitor's steps: the figures the goodput account needs.

Runs on rank 0 only, attached to the main monitor (worker/monitor.py). At every step it reads
the clock a few times (no host sync, no allocation); at each of the monitor's checks, and once at
the loop's end, it sends a `ClockReading` (record/fit_timeline.py) to the run ledger with an
actor call never awaited: one small message per check, from one rank.

    monitor attached                      -> the first step begins (the clock's zero)
    optimizer step ends (its post hook)   -> the data wait begins (else: when mon.step returns)
    the model's forward pre hook, first   -> the data wait ends
    mon.step(loss) called .. returns      -> the monitor's time (its check, the fleet's probe, the row)
    ray_ormas.report(...) .. returns      -> the reports' time (meeting, upload, Ray's report, checkpoint)
    ray_ormas.save_checkpoint(...)        -> the same (`counted_as_checkpoint`)
    a step's wall time, less those three  -> the step's compute time

Hooks relied on: `nn.Module.register_forward_pre_hook`, `torch.optim.Optimizer.register_step_post_hook`,
the ledger's `goodput_clock` actor method.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Iterator

import torch
import torch.nn as nn

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.fit_timeline import ClockReading

logger = get_logger("ray_ormas.goodput")
WINDOW_KEPT = 256  # step times kept between two readings, for their median
_ACTIVE: list[StepClock] = []  # this process's clock (rank 0's, while its main monitor is open)


@contextlib.contextmanager
def counted_as_checkpoint() -> Iterator[None]:
    """Time spent in here (`ray_ormas.save_checkpoint`) is the checkpoint bucket's, not a data wait."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if _ACTIVE:
            _ACTIVE[-1].reporting(time.perf_counter() - started)


class StepClock:
    """See the module docstring: rank 0's main monitor's clock, from its attach (`step_offset`:
    the run step its first step takes)."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, ledger: Any, token: str, step_offset: int
    ) -> None:
        self._ledger, self._token, self._offset = ledger, token, step_offset
        self._zero = time.perf_counter()
        self._step_began = self._zero  # the previous step's end: this step's wall time starts here
        self._data_from: float | None = self._zero  # the data wait runs from here until a forward pass
        self._data = self._monitor = self._report = self._compute = 0.0
        self._step_data = self._step_report = 0.0  # of the step in progress
        self._steps = 0
        self._window: list[float] = []
        self._first: tuple[int, float] | None = None  # (steps, compute) up to the first reading
        self._last_parts = (0.0, 0.0)  # the step just called: (compute, data wait)
        self._first_step: tuple[float, float, float] | None = None  # its (compute, data wait, monitor)
        self._in_monitor_since: float | None = None
        self._failed = False
        self._loop_ended = False
        self._handles = [model.register_forward_pre_hook(self._forward_begins)]
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(self._optimizer_done))
        _ACTIVE[:] = [self]

    # ------------------------------------------------------------------ hooks
    def _forward_begins(self, *_: Any) -> None:
        if self._data_from is not None:
            self._step_data += time.perf_counter() - self._data_from
            self._data_from = None

    def _optimizer_done(self, *_: Any) -> None:
        self._data_from = time.perf_counter()

    # ------------------------------------------------------------------ the monitor's calls
    def step_called(self) -> None:
        """mon.step() was called: the step's own time ends, the monitor's begins."""
        now = time.perf_counter()
        compute = max(0.0, now - self._step_began - self._step_data - self._step_report)
        self._compute += compute
        self._data += self._step_data
        self._last_parts = (compute, self._step_data)
        self._report += self._step_report
        self._step_data = self._step_report = 0.0
        self._steps += 1
        if len(self._window) < WINDOW_KEPT:
            self._window.append(compute)
        self._in_monitor_since = now

    def step_returned(self, checked: bool) -> None:
        """mon.step() returned (after its check, when `checked`): the next step begins; a reading
        goes to the head after a check."""
        now = time.perf_counter()
        monitor = 0.0
        if self._in_monitor_since is not None:
            monitor = now - self._in_monitor_since
            self._monitor += monitor
            self._in_monitor_since = None
        if self._first_step is None and self._steps == 1:  # its one-offs: set-up after the attach, the first check
            self._first_step = (*self._last_parts, monitor)
        self._step_began = now
        self._data_from = now
        if checked:
            self.send()

    def reporting(self, seconds: float) -> None:
        """A report took `seconds` of the step in progress (or of the loop's end); one made inside
        the monitor's step (a periodic report) is taken out of the monitor's time."""
        if self._data_from is not None:
            self._data_from += seconds  # a report between the optimizer step and the next forward is no data wait
        if self._in_monitor_since is not None:
            self._in_monitor_since += seconds
            self._report += seconds
        else:
            self._step_report += seconds

    def monitor_closed(self, seconds: float) -> None:
        """The loop closed a monitor itself (`mon.close()`), in `seconds`: the monitor's time. At
        the loop's end ray-ormas closes them, and that time is the last reading's `closing_s`."""
        if not self._loop_ended:
            self._monitor += seconds

    def loop_ended(self) -> None:
        self._loop_ended = True

    # ------------------------------------------------------------------ readings
    def reading(self, ended: bool = False, closing_s: float = 0.0) -> ClockReading:
        if self._first is None:
            self._first = (self._steps, self._compute)
        window = self._window
        return ClockReading(
            elapsed_s=time.perf_counter() - self._zero - (closing_s if ended else 0.0),
            steps=self._steps,
            compute_s=self._compute,
            data_s=self._data,
            monitor_s=self._monitor,
            report_s=self._report + (self._step_report if ended else 0.0),
            step_s=statistics.median(window) if window else None,
            first_steps=self._first[0],
            first_compute_s=self._first[1],
            ended=ended,
            closing_s=closing_s,
            first_step=self._first_step,
        )

    def send(self, ended: bool = False, closing_s: float = 0.0) -> None:
        """The reading to the ledger, never awaited; a failure is said once (training goes on)."""
        if self._failed:
            return
        try:
            self._ledger.goodput_clock.remote(self._token, self._offset, self.reading(ended, closing_s))
            self._window = []
        except Exception as e:  # telemetry never breaks training
            self._failed = True
            logger.warning(
                "could not send the step clock to the head (%s: %s); the goodput account stops here",
                type(e).__name__,
                e,
            )

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self in _ACTIVE:
            _ACTIVE.remove(self)
