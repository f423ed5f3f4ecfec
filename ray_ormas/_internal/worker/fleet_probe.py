"""One rank's fleet facts, measured over the steps before each of the monitor's checks and sent
to the head node.

Runs on every rank, attached to the main monitor (worker/session.py). The last
`timed_steps(check_every)` steps up to a check (at most TIMED_STEPS) are timed, and the check
carries the median of each timing over them: a rank descheduled for a few milliseconds in one or
two of those steps (a busy node) keeps its usual time, and a rank that is slow at every step shows
it whole. Outside those steps an unsampled step costs a flag test and a modulo; the hooks exist
only inside them:

    ... step k-1 ends (mon.step returns)     -> clock read; hooks armed (the window's first step)
    DDP wrapper's forward pre-hook           -> data_s    = now - end of step k-1
    inner module's forward pre/post hooks    -> forward_s = the forward passes' own time
    mon.step(loss) of step k is called       -> wall_s    = now - end of step k-1
    ... the same for each step of the window, up to the sampled step s ...
    the monitor's check of s has run         -> the medians over the window's steps; loss,
                                                digest, non-finite gradients: one host read per
                                                device; the facts go to the node's relay
                                                (node/fleet_relay.py; to the run ledger until it
                                                has started) with an actor call never awaited

When an alarm can act (`FleetSettings.actions`), the probe keeps the reference of its last
`fleet_facts` call and reads its answer at the next check: the head's order for this attempt
(head/fleet_actions.py), which the monitor raises after the check's row is on disk
(worker/monitor.py). The ledger answers once every rank's facts of that check are in, so every
rank reads the same order at the same check; by the next check the answer has come, and reading
it is not a wait (the ledger answers within ORDER_WAIT_S in any case). The probe also tells the
head once where this rank runs (its worker actor, node and process), for a hang's action and for
`diagnose`.

`data_s` covers everything between two steps (loading, host-to-device copy, the previous
optimizer step); `forward_s` is the forward compute alone: the hook sits inside DDP's wrapper,
so DDP's buffer broadcast (a collective) is not in it. Backward is not measured: DDP's gradient
all-reduce overlaps it, so its wall time includes waiting for the slowest rank. On a GPU,
`forward_s` is measured with CUDA events (device time), read after the monitor's check has
synchronized; `data_s` and `wall_s` are host time. Under FSDP the forward includes the parameter
all-gathers, so `forward_s` there is not wait-free (docs/fleet-health.md).

Hooks relied on: `nn.Module.register_forward_pre_hook` / `register_forward_hook`, the
monitor's public `step_count`, `checks` and `check_every`, `ray.util.get_node_ip_address`,
`ray.get` with a timeout, `ray.get_runtime_context()` (`current_actor`, `get_node_id`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import statistics
import time
from typing import Any, NamedTuple

import ray
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ray_ormas._internal.common.fleet_records import Order
from ray_ormas._internal.fleet.digest import digest_of, parameter_checksums, read_per_device
from ray_ormas._internal.fleet.facts import RankFacts
from ray_ormas._internal.worker.reporting import loss_value

GROUPS = 64  # the parameter list is cut into at most this many digest groups
TIMED_STEPS = 8  # a check carries the median timings of at most this many steps up to it
NONFINITE_LAYERS_SHOWN = 8
READ_ORDER_S = 10.0  # the ledger answers within its ORDER_WAIT_S (5 s); this only bounds a lost answer
RELAY_S = 10.0  # the longest a rank waits, once per attempt, for its node's relay's handle
END_ORDER_S = 60.0  # at the loop's end the ledger answers once a diagnose under way is done (at most 35 s)


class _StepTimes(NamedTuple):
    data_s: float | None
    forward_s: float
    wall_s: float


class RankProbe:
    """Fleet facts of the main monitor's model on this rank (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        ledger: Any,
        token: str,
        rank: int,
        node: str,
        world_size: int,
        acts: bool = False,
    ) -> None:
        self._outer = model
        self._inner = model.module if isinstance(model, DistributedDataParallel) else model
        self._ledger = ledger
        self._relay, self._relay_ready, self._local_ranks = None, None, 1
        with contextlib.suppress(Exception):  # without it: straight to the ledger
            context = ray.train.get_context()
            self._local_ranks = context.get_local_world_size()
            node_id = ray.get_runtime_context().get_node_id()
            self._relay = ray.get(ledger.fleet_relay.remote(token, node_id), timeout=RELAY_S)
            self._relay_ready = self._relay.__ray_ready__.remote()  # read, never waited for, at each check
        self._token = token
        self._rank = rank
        self._world = world_size  # this attempt's (an elastic fit restarts at other sizes)
        self._unreadable_said = False  # the head was told this rank's facts cannot be read
        self._node = node
        first = next(iter(model.parameters()), None)
        self._cuda = first is not None and first.is_cuda
        self._handles: list[Any] = []
        self._t_end = time.perf_counter()  # step 0 is sampled: its data time runs from here (warm-up)
        self._data_s: float | None = None  # of the step in progress
        self._forward_s = 0.0  # of the step in progress (host clock)
        self._step_open = False  # a step of the window has begun and its mon.step() is not yet called
        self._timed: list[_StepTimes] = []  # the window's closed steps
        self._forwards = 0
        self._started: Any = None
        self._events: list[tuple[int, Any, Any]] = []  # (step of the window, start, end): CUDA
        self._group_names: tuple[tuple[str, str], ...] | None = None
        self.armed = False
        self._acts = acts
        self._answer: Any = None  # the last fleet_facts call's reference (when an alarm can act)
        self.order: Order | None = None  # the head's order for this attempt, once read
        if acts:
            self._say_where()
        self.arm()

    def _say_where(self) -> None:
        with contextlib.suppress(Exception):  # without it, a hang's action and diagnose say they cannot
            context = ray.get_runtime_context()
            self._ledger.fleet_rank.remote(
                self._token, self._rank, context.current_actor, context.get_node_id(), self._node, os.getpid()
            )

    # ------------------------------------------------------------------ timing
    def arm(self) -> None:
        """The window before the next check begins with the next step: start its clock and put
        the hooks on."""
        self._timed, self._forwards, self._events = [], 0, []
        self._open_step()
        if not self._handles:
            self._handles = [
                self._outer.register_forward_pre_hook(self._outer_pre),
                self._inner.register_forward_pre_hook(self._inner_pre),
                self._inner.register_forward_hook(self._inner_post),
            ]
        self.armed = True

    def step_called(self) -> None:
        """mon.step() of a step in the window was called: the rank's step is done but for the
        monitor's own work."""
        if self._step_open:
            self._step_open = False
            wall = time.perf_counter() - self._t_end
            self._timed.append(_StepTimes(self._data_s, self._forward_s, wall))

    def between_steps(self, next_step: int, check_every: int) -> None:
        """mon.step() of a step that was not checked has returned: the next step of the window
        begins, or the window begins if the next check is `timed_steps` steps away."""
        if self.armed:
            self._open_step()
        elif (next_step + timed_steps(check_every) - 1) % check_every == 0:
            self.arm()

    def _open_step(self) -> None:
        self._t_end = time.perf_counter()
        self._data_s = self._started = None
        self._forward_s = 0.0
        self._step_open = True

    def _training(self, module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled()

    def _outer_pre(self, module: nn.Module, inputs: Any) -> None:
        if self._data_s is None and self._training(module):
            self._data_s = time.perf_counter() - self._t_end

    def _inner_pre(self, module: nn.Module, inputs: Any) -> None:
        if not self._training(module):
            return
        if self._cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._started = start
        else:
            self._started = time.perf_counter()

    def _inner_post(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self._started is None:
            return
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((len(self._timed), self._started, end))
        else:
            self._forward_s += time.perf_counter() - self._started
        self._forwards += 1
        self._started = None

    def _disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.armed = False

    # ------------------------------------------------------------------ the check
    def checked(self, check: int, step: int, loss: torch.Tensor | float | None) -> None:
        """The monitor's check of `step` has run: read this rank's facts, send them, take the
        hooks off. Never raises: telemetry never breaks training."""
        self.step_called()  # a check from a path that did not say the step was called
        self._disarm()
        try:
            facts = self._facts(check, step, loss)
        except Exception as e:  # telemetry never breaks training; the head names this rank, once
            if not self._unreadable_said:
                self._unreadable_said = True
                with contextlib.suppress(Exception):
                    self._ledger.fleet_unreadable.remote(self._token, self._rank, check, f"{type(e).__name__}: {e}")
            return
        if self._acts:
            self._read_order()
        try:
            relay = self._relay if self._relay_started() else None
            if relay is not None:
                answer = relay.facts.remote(self._token, self._local_ranks, facts)
            else:
                answer = self._ledger.fleet_facts.remote(self._token, facts)
            if self._acts:
                self._answer = answer
        except Exception:  # a gone ledger or relay: the next check tries again (straight to the ledger)
            self._relay = None

    def _relay_started(self) -> bool:
        """Whether this node's relay is there and has started (until then: straight to the ledger)."""
        if self._relay is None or self._relay_ready is None:
            return self._relay is not None
        with contextlib.suppress(Exception):
            ready, _ = ray.wait([self._relay_ready], timeout=0)
            if ready:
                ray.get(self._relay_ready)  # raises if it could not start
                self._relay_ready = None
                return True
            return False
        self._relay = None  # it could not start: this rank sends to the ledger itself
        return False

    def order_at_end(self) -> Order | None:
        """The loop ended on every rank: the head's order that came after this rank's last check
        (its answer, then any an action under way gives: worker/session.py raises it), or None.
        Never raises: without an answer the fit ends as the loop did."""
        if not self._acts:
            return None
        self._read_order()
        if self.order is None:
            with contextlib.suppress(Exception):
                self.order = ray.get(self._ledger.fleet_order_at_end.remote(self._token), timeout=END_ORDER_S)
        return self.order

    def _read_order(self) -> None:
        """The answer to the last check's call: the head's order, if any."""
        if self._answer is None or self.order is not None:
            return
        try:
            self.order = ray.get(self._answer, timeout=READ_ORDER_S)
        except ray.exceptions.RayActorError:  # the relay is gone: this rank sends to the ledger itself
            self._relay = None
        except Exception:  # a gone or late ledger gives no order
            pass

    def _facts(self, check: int, step: int, loss: torch.Tensor | float | None) -> RankFacts:
        timed = self._timed or [_StepTimes(self._data_s, self._forward_s, time.perf_counter() - self._t_end)]
        if self._events:  # the monitor's check has synchronized the device
            device = [0.0] * len(timed)
            for i, start, end in self._events:
                device[min(i, len(timed) - 1)] += start.elapsed_time(end) / 1000.0
            timed = [t._replace(forward_s=f) for t, f in zip(timed, device)]
        datas = [t.data_s for t in timed if t.data_s is not None]
        digest, groups, bad_layers = self._readings()
        loss_now = loss_value(loss)
        return RankFacts(
            rank=self._rank,
            world=self._world,
            node=self._node,
            check=check,
            step=step,
            data_s=statistics.median(datas) if datas else None,
            forward_s=statistics.median(t.forward_s for t in timed) if self._forwards else None,
            wall_s=statistics.median(t.wall_s for t in timed),
            timed_steps=len(self._timed),
            forwards=self._forwards,
            loss=loss_now,
            nonfinite_loss=loss_now is not None and not math.isfinite(loss_now),
            nonfinite_layers=tuple(bad_layers),
            digest=digest,
            groups=tuple(groups),
            # once per attempt (and once more, for safety)
            group_names=self._group_names if self._group_names is not None and check <= 1 else None,
        )

    @torch.no_grad()
    def _readings(self) -> tuple[str, list[str], list[str]]:
        """(parameter digest, digests of up to GROUPS consecutive parameter groups, layers whose
        gradient is not finite), with one host read per device."""
        labels, sums = parameter_checksums(self._outer, gradient_flags=True)
        rows = read_per_device(sums)
        raw = [r[:2].tobytes() for r in rows]
        bounds = _group_bounds(len(labels))
        groups = [
            hashlib.sha256(b"".join(raw[a:b]) + "|".join(labels[a:b]).encode()).hexdigest()[:8] for a, b in bounds
        ]
        if self._group_names is None:
            self._group_names = tuple((_name(labels[a]), _name(labels[b - 1])) for a, b in bounds)
        bad: list[str] = []
        for label, row in zip(labels, rows):
            if not row[2]:
                name = _name(label)
                layer = name.rsplit(".", 1)[0] if "." in name else name
                if layer not in bad:
                    bad.append(layer)
        return digest_of(labels, raw), groups, bad[:NONFINITE_LAYERS_SHOWN]


def timed_steps(check_every: int) -> int:
    """How many steps up to a check are timed for it."""
    return max(1, min(TIMED_STEPS, check_every))


def _name(label: str) -> str:
    """The parameter name of a checksum label `name:shape:dtype`, without DDP's `module.` prefix."""
    name = label.split(":", 1)[0]
    return name.removeprefix("module.")


def _group_bounds(n: int) -> list[tuple[int, int]]:
    """[a, b) index ranges cutting n parameters into at most GROUPS consecutive groups."""
    if n == 0:
        return []
    size = -(-n // GROUPS)
    return [(a, min(a + size, n)) for a in range(0, n, size)]
