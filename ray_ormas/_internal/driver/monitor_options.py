"""The trainer's monitor options, on the driver: `monitor=MonitorSettings(...)`, or the flat keywords.

`RayOrmasTrainer(monitor=MonitorSettings(...))` is the monitor's settings as one object, in line
with `mlflow=`, `fleet=`, `ScalingConfig` and `RunConfig`. `repair=` and `check_every=` stay as
shortcuts beside it: each sets a field the object leaves at its default, and a field set both
ways is an `OptionError` naming it. The other flat keywords (`monitor_config=`, `layers=`,
`verbose=`, ...) still build the settings when `monitor=` is not given, as before; with it, they
are refused, naming the field to set in the object instead.
"""

from __future__ import annotations

from typing import Any

from ormas_monitor import MonitorConfig

from ray_ormas._internal.common.settings import DEFAULT_SYNC_TIMEOUT_S, MonitorSettings, RepairMode
from ray_ormas.errors import OptionError, OptionTypeError

# The flat keywords that are fields of MonitorSettings (or, for monitor_config, its thresholds),
# with the value that means "not given".
_NOT_GIVEN: dict[str, Any] = {
    "monitor_config": None,
    "layers": None,
    "verbose": True,
    "progress": True,
    "ray_report_lines": False,
    "report_every": None,
    "sync_timeout_s": DEFAULT_SYNC_TIMEOUT_S,
    "auto_monitor": True,
}


def monitor_settings(
    monitor: MonitorSettings | None,
    *,
    repair: RepairMode,
    check_every: int | None,
    monitor_config: MonitorConfig | None,
    **flat: Any,
) -> MonitorSettings:
    """The settings every rank builds its monitor from, from the trainer's options."""
    if monitor is None:
        return MonitorSettings.build(repair=repair, check_every=check_every, monitor_config=monitor_config, **flat)
    if not isinstance(monitor, MonitorSettings):
        raise OptionTypeError(
            f"monitor must be a ray_ormas.MonitorSettings(repair=..., check_every=..., ...) or None, "
            f"got {type(monitor).__name__}"
        )
    given = {"monitor_config": monitor_config, **flat}
    refused = [name for name, value in given.items() if value != _NOT_GIVEN[name]]
    if refused:
        field = {"monitor_config": "thresholds and check_every"}
        raise OptionError(
            "; ".join(
                f"{name}: with monitor=MonitorSettings(...), set {field.get(name, name)} in it "
                f"(MonitorSettings({'thresholds=...' if name == 'monitor_config' else name + '=...'}))"
                for name in refused
            )
        )
    return monitor.with_shortcuts(repair=repair, check_every=check_every)
