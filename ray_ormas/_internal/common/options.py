"""The one options model: the settings the Python API takes are pydantic dataclasses, and the
`ray-ormas train` YAML schema (common/job_config.py) uses the very same classes for its sections.

So there is one set of fields, defaults, constraints and descriptions. From Python they are
strict (`verbose="yes"` is an error, not True); from YAML they are validated in pydantic's lax
mode, which takes YAML's own types (a list for a tuple, an int for a float). A constraint that
fails names its field: from YAML as a key path (`mlflow.request_timeout_s: ...`), from the
trainer's keyword options as `OptionError` lines (`sync_timeout_s: Input should be greater than
0, got 0`), built by `build` here.

Built from Python, a settings class refuses a bad value with `OptionError` (a `RayOrmasError`),
not pydantic's `ValidationError` (`refuse_as_option_error`).

Relies on pydantic v2's public API (`pydantic.dataclasses.dataclass`, `Field`, `ValidationError`).
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError

from ray_ormas.errors import OptionError

SETTINGS_CONFIG = ConfigDict(extra="forbid", strict=True, validate_default=True)

T = TypeVar("T")


def describe_errors(
    error: ValidationError,
    prefix: str = "",
    *,
    unknown: str = "unknown option (check the spelling)",
    show_input: bool = True,
    top_level: str | None = None,
) -> list[str]:
    """One line per problem, `prefix` + the option's name first; `unknown` for a name the class
    does not have; the value given after the message unless not `show_input`; a check across
    options as its own message, or after `top_level` when given."""
    lines = []
    for e in error.errors():
        where = ".".join(str(p) for p in e["loc"])
        message = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            message = unknown
        got = (
            "" if not show_input or e["type"].startswith("value_error") or "input" not in e else f", got {e['input']!r}"
        )
        if where:
            lines.append(f"{prefix}{where}: {message}{got}")
        elif top_level is not None:
            lines.append(f"{top_level}: {message}{got}")
        else:  # a check across options: the class's own message
            lines.append(f"{prefix.rstrip('.')}: {message}" if prefix else message)
    return lines


VALIDATION = "_validation"  # where a settings class's OptionError keeps pydantic's error, for `build`


def refuse_as_option_error(cls: type[T]) -> type[T]:
    """Make building `cls` (a settings dataclass) with a bad value raise `OptionError` (a
    `RayOrmasError` and a `ValueError`) naming each option as `Class.option`, instead of
    pydantic's `ValidationError`. Validation inside a YAML config's model does not go through
    `__init__` and keeps its own errors (job_config.py)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as e:
            error = OptionError("; ".join(describe_errors(e, f"{cls.__name__}.")))
            setattr(error, VALIDATION, e)  # `build` names the options in its caller's words
            raise error from None

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def build(cls: type[T], prefix: str | None = None, **options: Any) -> T:
    """`cls(**options)`, with a validation error turned into an `OptionError` naming each option
    (after `prefix`, by default the class's name and a dot)."""
    try:
        return cls(**options)
    except (OptionError, ValidationError) as e:
        validation = e if isinstance(e, ValidationError) else getattr(e, VALIDATION, None)
        if validation is None:
            raise
        raise OptionError(
            "; ".join(describe_errors(validation, f"{cls.__name__}." if prefix is None else prefix))
        ) from None
