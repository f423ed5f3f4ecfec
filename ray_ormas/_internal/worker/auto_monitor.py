"""Zero-change mode for a plain Ray Train loop: a monitor on each model an optimizer steps.

A loop written for `TorchTrainer` builds no monitor. While its ray-ormas session runs,
`AutoMonitors` watches it through PyTorch's public hooks only:

* `torch.nn.modules.module.register_module_forward_pre_hook` / `register_module_forward_hook`,
  global, only until the models are known (the second step of any optimizer): which top-level
  modules the loop calls in training mode, whether their output carries a `loss`, and which
  parameter-free module (the criterion) takes their output and returns a scalar.
* `torch.optim.optimizer.register_optimizer_step_pre_hook`, global, for the whole loop: it runs
  right before every `optimizer.step()`, after backward, after GradScaler's `unscale_` (which
  `scaler.step` does first), and only on steps GradScaler does not skip. At an optimizer's first
  step, the model is the top-level module holding most of the parameters it steps; the monitor
  is built on that model with that optimizer (so repair resets the optimizer's state) and steps
  in this hook from the optimizer's next step on: it must see a forward pass to learn the
  model's structure, and the first one is over by then. Its segment's `step_offset` counts that
  step, so run steps stay the loop's optimizer steps. With gradient accumulation the optimizer
  steps once per window, and so does the monitor, with the mean of the window's losses.

The loss comes from the model's own output (`output.loss`, `output["loss"]`) or from the one
loss module called on the model's output (`criterion(model(x), y)`). A functional loss
(`F.cross_entropy`) or several loss modules leave the monitor without loss checks; the segment's
`segment.json` says which (`attached.loss`). With more than one model followed (a GAN), loss
modules are not used: their calls cannot be told apart by model. The loop's own
`ray_ormas.monitor(...)` wins: once the loop has built one, no optimizer that steps for the first
time after that gets an automatic monitor (a deliberately unwatched model stays unwatched).
"""

from __future__ import annotations

import weakref
from typing import Any, Mapping

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ray_ormas._internal.common.logs import get_logger
from ray_ormas._internal.record.layout import DEFAULT_MONITOR_NAME
from ray_ormas._internal.worker.monitor import MonitorRuntime
from ray_ormas._internal.worker.plan import EXPLICIT, Attach
from ray_ormas._internal.worker.session import WorkerSession

logger = get_logger("ray_ormas.auto_monitor")

HOOK_NAME = "the optimizer step hook"
_IGNORED = object()  # an optimizer no automatic monitor follows


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returned with its output (`output.loss`, `output["loss"]`), if any."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad:
        return loss
    return None


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        return [v for v in output.values() if isinstance(v, torch.Tensor)]
    if isinstance(output, (tuple, list)):
        return [v for v in output if isinstance(v, torch.Tensor)]
    return []


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _is_loss(output: Any) -> bool:
    return (
        isinstance(output, torch.Tensor) and output.numel() == 1 and output.requires_grad and output.is_floating_point()
    )


def _inner(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


class _Follower:
    """One automatic monitor: its model, optimizer, loss hook and the MonitorRuntime."""

    def __init__(self, monitor: MonitorRuntime, loss_module: nn.Module | None, loss_from_output: bool) -> None:
        self.monitor = monitor
        self.loss_module = loss_module
        self._training = monitor.model  # its losses count only while it trains (not in validation)
        self._handle: Any = None
        if loss_from_output:
            self._handle = monitor.model.register_forward_hook(self._from_output)
        elif loss_module is not None:
            self._handle = loss_module.register_forward_hook(self._from_criterion)

    def _from_output(self, module: nn.Module, args: Any, output: Any) -> None:
        if module.training and torch.is_grad_enabled():
            loss = output_loss(output)
            if loss is not None:
                self.monitor.micro_step(loss)

    def _from_criterion(self, module: nn.Module, args: Any, output: Any) -> None:
        # On every training step: the fewest checks that keep validation losses out.
        if self._training.training and isinstance(output, torch.Tensor) and output.requires_grad:
            self.monitor.micro_step(output)

    def drop_loss_module(self) -> None:
        """Stop taking losses from the loss module, and forget those taken since the last step:
        the loss module was shared, so they may be another model's (the generator's loss, computed
        through the discriminator, reaches the discriminator's loss module too)."""
        if self.loss_module is not None and self._handle is not None:
            self._handle.remove()
            self._handle = None
            self.loss_module = None
            self.monitor.discard_micro_steps()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class AutoMonitors:
    """Builds and steps the automatic monitors of one session (see the module docstring)."""

    def __init__(self, session: WorkerSession) -> None:
        self._session = session
        self._followers: dict[int, Any] = {}  # id(optimizer) -> _Follower or _IGNORED
        self._optimizers: list[Any] = []  # kept alive, so their ids stay theirs
        self._auto: list[_Follower] = []
        self._depth = 0
        self._called: dict[int, nn.Module] = {}  # top-level modules called in training
        self._outputs: dict[int, tuple[Any, int]] = {}  # their outputs (weak) -> module id
        self._loss_modules: dict[int, dict[int, nn.Module]] = {}  # model id -> criteria called on its output
        self._with_output_loss: set[int] = set()
        self._warned: set[str] = set()
        self._discovery: list[Any] = []
        self._step_hook: Any = None

    # ------------------------------------------------------------------ lifecycle
    def install(self) -> None:
        self._discovery = [
            nn.modules.module.register_module_forward_pre_hook(self._pre),
            nn.modules.module.register_module_forward_hook(self._post, always_call=True),
        ]
        self._step_hook = register_optimizer_step_pre_hook(self._before_step)

    def remove(self) -> None:
        self._end_discovery()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        for follower in self._auto:
            follower.remove()
        self._followers, self._optimizers = {}, []

    def _end_discovery(self) -> None:
        for handle in self._discovery:
            handle.remove()
        self._discovery = []
        unclaimed = [m for m in self._called.values() if self._session.monitor_of(m) is None]
        self._called, self._outputs, self._loss_modules = {}, {}, {}
        if unclaimed and self._session.monitors:
            names = ", ".join(sorted({type(_inner(m)).__name__ for m in unclaimed}))
            self._warn(
                "unclaimed",
                f"{names} ran forward in training mode but no optimizer stepped its parameters "
                f"in the first steps, so no monitor follows it. If an optimizer steps it later, "
                f"build its monitor yourself: ray_ormas.monitor(model, optimizer)",
            )

    # ------------------------------------------------------------------ discovery hooks
    def _pre(self, module: nn.Module, args: Any) -> None:
        self._depth += 1

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth != 0 or not torch.is_grad_enabled():
            return
        try:
            if _trainable(module):
                if module.training:
                    self._called[id(module)] = module
                    # Weak: a language model's logits are large, and nothing here may keep them alive.
                    self._outputs.update({id(t): (weakref.ref(t), id(module)) for t in _tensors(output)})
                    if output_loss(output) is not None:
                        self._with_output_loss.add(id(module))
            elif _is_loss(output):
                for arg in args:
                    seen = self._outputs.get(id(arg)) if isinstance(arg, torch.Tensor) else None
                    if seen is not None and seen[0]() is arg:
                        self._loss_modules.setdefault(seen[1], {})[id(module)] = module
        except Exception as e:  # telemetry never breaks training
            self._warn("discovery", f"could not follow the loop's modules ({type(e).__name__}: {e})")

    # ------------------------------------------------------------------ the step hook
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        follower = self._followers.get(id(optimizer))
        if follower is None:
            self._optimizers.append(optimizer)
            try:
                self._followers[id(optimizer)] = self._meet(optimizer)
            except Exception as e:  # telemetry never breaks training
                self._followers[id(optimizer)] = _IGNORED
                self._warn(
                    f"attach-{id(optimizer)}",
                    f"could not attach a monitor for {type(optimizer).__name__} "
                    f"({type(e).__name__}: {e}); training goes on without it",
                )
            self._outputs.clear()
            return
        if self._discovery:
            self._end_discovery()
        if follower is _IGNORED:
            return
        try:
            follower.monitor.step()
        except Exception as e:  # telemetry never breaks training: the monitor stops, the loop goes on
            self._followers[id(optimizer)] = _IGNORED
            follower.remove()
            self._warn(
                f"step-{follower.monitor.name}",
                f"monitor {follower.monitor.name!r} failed at a step and stops following "
                f"{type(optimizer).__name__} ({type(e).__name__}: {e}); training goes on",
            )

    def _meet(self, optimizer: torch.optim.Optimizer) -> Any:
        """At an optimizer's first step: the follower of the model it steps, or _IGNORED."""
        session = self._session
        if any(mon.exclusive or mon.attached_by == EXPLICIT for mon in session.monitors.values()):
            return _IGNORED  # the loop builds its own monitors, or a framework's callback steps them
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        overlap = [(sum(id(p) in stepped for p in m.parameters()), m) for m in self._called.values()]
        overlap = [(n, m) for n, m in overlap if n]
        if not overlap:
            self._warn(
                f"none-{id(optimizer)}",
                f"{type(optimizer).__name__} steps the parameters of no model the loop called in training "
                f"mode before its first step, so no monitor follows it. Call the model (in train() mode, with "
                f"gradients on) before optimizer.step(), or build the monitor yourself: "
                f"mon = ray_ormas.monitor(model, optimizer) and mon.step(loss) before optimizer.step()",
            )
            return _IGNORED
        model = max(overlap, key=lambda pair: pair[0])[1]
        owner = session.monitor_of(model)
        if owner is not None:
            if owner.attached_by == HOOK_NAME:
                self._warn(
                    f"two-{id(model)}",
                    f"two optimizers step {type(_inner(model)).__name__}: its monitor {owner.name!r} follows "
                    f"{type(owner.optimizer).__name__} only, and {type(optimizer).__name__}'s steps are not "
                    f"monitor steps. To choose, build it yourself: ray_ormas.monitor(model, optimizer)",
                )
            return _IGNORED  # the loop's own monitor (or the first optimizer's) wins
        return self._attach(model, optimizer)

    def _attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> _Follower:
        session = self._session
        loss_modules = list(self._loss_modules.get(id(model), {}).values())
        from_output = id(model) in self._with_output_loss
        several = bool(self._auto)
        if several:
            for follower in self._auto:
                self._drop_loss_modules(follower)
        loss_module = loss_modules[0] if len(loss_modules) == 1 and not from_output and not several else None
        loss, note = _loss_source(from_output, loss_modules, several)
        name = DEFAULT_MONITOR_NAME if not session.monitors else session.free_name(type(_inner(model)).__name__.lower())
        facts = {
            "by": HOOK_NAME,
            "optimizer": type(optimizer).__name__,
            "model": type(_inner(model)).__name__,
            "first_loop_step": 1,
            "loss": loss,
            **({"loss_note": note} if note else {}),
        }
        monitor = session.add_monitor(model, optimizer, name, None, (), Attach(by=HOOK_NAME, facts=facts, first_step=1))
        follower = _Follower(monitor, loss_module, from_output)
        self._auto.append(follower)
        if session.rank == 0:
            logger.info(
                "monitor %r follows %s, stepped by %s, from the loop's step 2 on; loss: %s",
                name,
                facts["model"],
                facts["optimizer"],
                loss or f"none ({note})",
            )
        return follower

    def _drop_loss_modules(self, follower: _Follower) -> None:
        if follower.loss_module is None:
            return
        follower.drop_loss_module()
        note = (
            "several models are trained, and a loss module's calls cannot be told apart by model; "
            "give the loss with ray_ormas.monitor(model, optimizer) and mon.step(loss)"
        )
        follower.monitor.update_attached(loss=None, loss_note=note)
        self._warn(
            f"drop-{follower.monitor.name}",
            f"monitor {follower.monitor.name!r} stops taking its loss from a loss module: {note}",
        )

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message, rank=self._session.rank)


def _loss_source(from_output: bool, loss_modules: list[nn.Module], several: bool) -> tuple[str | None, str | None]:
    """(what the monitor's loss is, or None; why there is none)."""
    if from_output:
        return "the model's output (its loss)", None
    if several and loss_modules:
        return None, (
            "several models are trained, and a loss module's calls cannot be told apart by model; give "
            "the loss with ray_ormas.monitor(model, optimizer) and mon.step(loss)"
        )
    if len(loss_modules) == 1:
        return f"{type(loss_modules[0]).__name__} (the loss module called on the model's output)", None
    if loss_modules:
        kinds = ", ".join(type(m).__name__ for m in loss_modules)
        return None, (
            f"several loss modules ({kinds}) take the model's output, so the loss is not known; give it "
            f"with ray_ormas.monitor(model, optimizer) and mon.step(loss)"
        )
    return None, (
        "no loss module took the model's output (a functional loss such as F.cross_entropy, or none); the "
        "monitor runs without loss checks. Give the loss with ray_ormas.monitor(model, optimizer) and "
        "mon.step(loss), or compute it with a loss module (nn.CrossEntropyLoss())"
    )
