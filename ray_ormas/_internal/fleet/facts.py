"""What one rank sends the head node at one fleet check: a typed, picklable message.

Built on every rank by the fleet probe (worker/fleet_probe.py), sent with
`RunLedger.fleet_facts` (a Ray actor call, pickled) and read on the head node by the fleet
analysis (fleet/analysis.py). A frozen dataclass with slots: it is made at every check on every
rank, so it validates nothing at run time (the probe is its only author) and costs what a dict
costs to pickle; mypy checks both ends. No Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankFacts:
    """One rank's facts at one check."""

    rank: int
    check: int  # the monitor's check index in this attempt (0, 1, ...)
    step: int  # the segment's step of the check (the head adds the attempt's offset)
    world: int | None = None  # the attempt's ranks (None: the fit's)
    node: str | None = None  # the rank's node address
    data_s: float | None = None  # median seconds waiting for data over the timed steps
    forward_s: float | None = None  # median seconds in the forward pass (device time on GPUs)
    wall_s: float | None = None  # median seconds of a whole step
    timed_steps: int = 0
    forwards: int = 0  # forward passes seen since the last check
    loss: float | None = None
    nonfinite_loss: bool = False
    nonfinite_layers: tuple[str, ...] = ()  # layers with a non-finite gradient (at most a few)
    digest: str | None = None  # the parameter digest (fleet/digest.py)
    groups: tuple[str, ...] = ()  # digests of consecutive parameter groups
    group_names: tuple[tuple[str, str], ...] | None = None  # (first, last) parameter of each group, once per attempt

    @property
    def busy_s(self) -> float | None:
        """The part of a step the rank spends before it waits on the others: data + forward."""
        if self.data_s is None and self.forward_s is None:
            return None
        return (self.data_s or 0.0) + (self.forward_s or 0.0)
