"""Every error ray-ormas raises that a user can meet, under one base, `RayOrmasError`.

Each also subclasses the builtin it always was (`ValueError`, `TypeError`, `RuntimeError`,
`TimeoutError`, `FileNotFoundError`, `ImportError`), so
an `except ValueError:` written before the base existed still catches it. Bad input is refused on
the driver, before any worker starts, wherever it can be known there.

    try:
        ray_ormas.RayOrmasTrainer(loop, repair="sometimes").fit()
    except ray_ormas.RayOrmasError as e:      # or OptionError, or ValueError
        print(e)
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "FleetReattemptError",
    "FleetStopError",
    "JournalError",
    "MissingExtraError",
    "OptionError",
    "OptionTypeError",
    "OrmasCompatError",
    "RankMismatchError",
    "RankSyncTimeoutError",
    "RayOrmasError",
    "RaySeamChanged",
    "RecordStorageError",
    "StoragePathError",
    "UsageError",
]


class RayOrmasError(Exception):
    """The base of every ray-ormas error."""


class OptionError(RayOrmasError, ValueError):
    """Options that cannot be used; each problem (separated by "; ") names its option."""


class OptionTypeError(RayOrmasError, TypeError):
    """An option or argument of the wrong type; the message names it and what it takes."""


class UsageError(RayOrmasError, RuntimeError):
    """A ray-ormas call or hook that cannot work where it is used (outside a RayOrmasTrainer loop,
    a framework hook that is missing or changed); the message says what to do instead."""


class CheckpointError(RayOrmasError, ValueError):
    """A checkpoint that cannot be loaded as asked (no optimizer state to load, ...)."""


class CheckpointNotFoundError(RayOrmasError, FileNotFoundError):
    """A checkpoint without the state `ray_ormas.save_checkpoint` writes."""


class MissingExtraError(RayOrmasError, ImportError):
    """A framework that what was asked needs is not installed; the message names the extra
    (`pip install 'ray-ormas[lightning]'`, `'ray-ormas[transformers]'`)."""


class ConfigError(RayOrmasError, ValueError):
    """A `ray-ormas train` config file that cannot be used; the message names the key paths."""


class RecordStorageError(RayOrmasError, ValueError):
    """The record's storage cannot be used (unwritable, unknown scheme, unreadable)."""


class StoragePathError(RecordStorageError):
    """A storage location that cannot work; the message names the key and the value."""


class JournalError(RecordStorageError):
    """A run's MLflow journal (`<record root>/.mlflow/<fit id>.json`) that this ray-ormas cannot
    read: written by a newer ray-ormas (the message names both versions), or damaged."""


class RankMismatchError(RayOrmasError, RuntimeError):
    """Ranks reached different ray-ormas reports: they ran different numbers of steps or reports."""


class RankSyncTimeoutError(RayOrmasError, TimeoutError):
    """A rank did not reach a ray-ormas report within `sync_timeout_s`."""


class OrmasCompatError(RayOrmasError, RuntimeError):
    """The installed ormas-monitor no longer behaves as ray-ormas expects."""


class RaySeamChanged(RayOrmasError, RuntimeError):
    """A private piece of Ray that ray-ormas relies on changed in the installed Ray release."""


class FleetStopError(RayOrmasError, RuntimeError):
    """An alarm whose action is `stop` ended the fit (`FleetSettings.actions`); the message names
    the alarm, the ranks, the node and the run step. Ray does not retry it."""


class FleetReattemptError(RayOrmasError, RuntimeError):
    """Raised on every rank at its next check when an alarm's action is `reattempt` (or `evict`,
    once the nodes are out of the run): the worker group fails through Ray's own path, and
    `FailureConfig` restarts it from a checkpoint."""
