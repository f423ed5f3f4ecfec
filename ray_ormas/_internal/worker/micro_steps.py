"""The losses of one optimizer step's micro-batches (gradient accumulation), kept on the device.

`WorkerMonitor.micro_step(loss)` adds each micro-batch's loss; the next `step()` without a loss
hands the monitor their mean, the objective whose gradient the optimizer step applies. Adding
never reads the device (no host sync). On the monitor's very first step the mean stays attached
to the last micro-batch's autograd graph (an exact zero is added through it), because the
monitor's first check walks that graph to learn which ReLU consumes each layer, which its
dead-channel certificate needs. Relies on nothing but torch.
"""

from __future__ import annotations

import torch


class MicroStepLosses:
    """Sum of the micro-batch losses since the last `take()`, and the last one's graph."""

    def __init__(self) -> None:
        self._only: torch.Tensor | None = None  # the first micro-batch's loss, as given
        self._sum: torch.Tensor | None = None
        self._last_with_graph: torch.Tensor | None = None
        self._count = 0

    def add(self, loss: torch.Tensor | float) -> None:
        # One micro-batch per optimizer step is the common case (the automatic mode feeds every
        # loss through here): keep it as it is, and start summing only when a second one comes.
        if self._count == 0 and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._only, self._count = loss, 1
            return
        if self._only is not None:
            first, self._only, self._count = self._only, None, 0
            self._add(first)
        self._add(loss)

    def _add(self, loss: torch.Tensor | float) -> None:
        if isinstance(loss, torch.Tensor):
            value = loss.detach()
            if value.dtype != torch.float32:
                value = value.float()
            if value.numel() != 1:
                value = value.mean()
        else:
            value = torch.tensor(float(loss))
        self._sum = value if self._sum is None else self._sum + value
        self._last_with_graph = loss if isinstance(loss, torch.Tensor) and loss.requires_grad else None
        self._count += 1

    def take_mean(self, keep_graph: bool = False) -> torch.Tensor | None:
        """The mean since the last call (None if nothing was added: not the same as 0), and reset.
        `keep_graph`: still attached to the last micro-batch's autograd graph."""
        if self._only is not None:  # one micro-batch: its loss itself, graph included
            only, self._only, self._count = self._only, None, 0
            return only
        total, last, count = self._sum, self._last_with_graph, self._count
        self._sum, self._last_with_graph, self._count = None, None, 0
        if total is None:
            return None
        mean = total if count == 1 else total / count  # one micro-batch: no device op
        if keep_graph and last is not None and last.grad_fn is not None:
            last = last.float().mean()
            mean = mean + (last - last.detach())
        return mean
