"""The one options model: the settings the Python API takes are pydantic dataclasses, and the
`ray-ormas train` YAML schema (common/job_config.py) uses the very same classes for its sections.

So there is one set of fields, defaults, constraints and descriptions. From Python they are
strict (`verbose="yes"` is an error, not True); from YAML they are validated in pydantic's lax
mode, which takes YAML's own types (a list for a tuple, an int for a float). A constraint that
fails names its field: from YAML as a key path (`mlflow.request_timeout_s: ...`), from the
trainer's keyword options as `OptionError` lines (`sync_timeout_s: Input should be greater than
0, got 0`), built by `build` here.

Relies on pydantic v2's public API (`pydantic.dataclasses.dataclass`, `Field`, `ValidationError`).
"""

from __future__ import annotations

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


def build(cls: type[T], prefix: str | None = None, **options: Any) -> T:
    """`cls(**options)`, with a validation error turned into an `OptionError` naming each option
    (after `prefix`, by default the class's name and a dot)."""
    try:
        return cls(**options)
    except ValidationError as e:
        raise OptionError("; ".join(describe_errors(e, f"{cls.__name__}." if prefix is None else prefix))) from None
