"""Every error ray-ormas raises that a user can meet, under one base, `RayOrmasError`.

Each also subclasses the builtin it always was (`ValueError`, `RuntimeError`, `TimeoutError`), so
an `except ValueError:` written before the base existed still catches it. Bad input is refused on
the driver, before any worker starts, wherever it can be known there.

    try:
        ray_ormas.RayOrmasTrainer(loop, repair="sometimes").fit()
    except ray_ormas.RayOrmasError as e:      # or OptionError, or ValueError
        print(e)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "OptionError",
    "OrmasCompatError",
    "RankMismatchError",
    "RankSyncTimeoutError",
    "RayOrmasError",
    "RaySeamChanged",
    "RecordStorageError",
    "StoragePathError",
]


class RayOrmasError(Exception):
    """The base of every ray-ormas error."""


class OptionError(RayOrmasError, ValueError):
    """Options that cannot be used; each problem (separated by "; ") names its option."""


class ConfigError(RayOrmasError, ValueError):
    """A `ray-ormas train` config file that cannot be used; the message names the key paths."""


class RecordStorageError(RayOrmasError, ValueError):
    """The record's storage cannot be used (unwritable, unknown scheme, unreadable)."""


class StoragePathError(RecordStorageError):
    """A storage location that cannot work; the message names the key and the value."""


class RankMismatchError(RayOrmasError, RuntimeError):
    """Ranks reached different ray-ormas reports: they ran different numbers of steps or reports."""


class RankSyncTimeoutError(RayOrmasError, TimeoutError):
    """A rank did not reach a ray-ormas report within `sync_timeout_s`."""


class OrmasCompatError(RayOrmasError, RuntimeError):
    """The installed ormas-monitor no longer behaves as ray-ormas expects."""


class RaySeamChanged(RayOrmasError, RuntimeError):
    """A private piece of Ray that ray-ormas relies on changed in the installed Ray release."""
