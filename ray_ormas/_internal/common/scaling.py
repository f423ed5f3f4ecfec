"""An elastic worker range, checked where it is given: `ScalingConfig(num_workers=(min, max))` in
Python, `scaling: {workers: [min, max]}` in a YAML config.

Ray Train V2 runs an elastic fit when `num_workers` is a pair: it starts the worker group at as
many workers as the cluster can place (at most `max`), and restarts it at another size when
nodes come and go (docs/elastic.md). ray-ormas needs `1 <= min <= max`: Ray refuses a negative
minimum and a minimum above the maximum when the ScalingConfig is built, but takes a minimum of 0,
which would start a group with no rank 0 to keep the record. Plain Python, used on the driver.
"""

from __future__ import annotations

from typing import Any

from ray_ormas.errors import OptionError


def elastic_range(num_workers: Any, option: str = "") -> tuple[int, int] | None:
    """(min, max) when `num_workers` asks for an elastic fit, None for a fixed count; a bad range
    raises ValueError naming `option` (the key in the caller's words; "" where the caller's error
    already names it) and what to give."""
    where = f"{option}: " if option else ""
    if not isinstance(num_workers, (tuple, list)):
        return None
    if len(num_workers) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in num_workers):
        raise OptionError(
            f"{where}an elastic range is two whole numbers [min, max] with 1 <= min <= max, got "
            f"{list(num_workers)!r}; or give one number for a fixed count of workers"
        )
    low, high = num_workers
    if low < 1:
        raise OptionError(
            f"{where}the elastic range [{low}, {high}] starts below 1 worker; an elastic fit needs at "
            f"least one worker in every attempt (rank 0 keeps the record). Give [1, {max(high, 1)}] or more"
        )
    if low > high:
        raise OptionError(
            f"{where}the elastic range [{low}, {high}] has its minimum above its maximum; give [{high}, {low}]"
        )
    return low, high
