"""docs/api.md, generated from the code: every public name's signature and docstring.

`python -m tests.api_reference > docs/api.md` writes it; tests/test_api_reference.py fails when
the file differs from what this prints (as docs/cli.md's config reference is checked). The public
names are `ray_ormas.__all__`, the framework callbacks of `ray_ormas.lightning` and
`ray_ormas.transformers`, and the errors of `ray_ormas.errors`; each section below lists its
names, and the test checks that every public name is in one.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import textwrap
from typing import Any

SECTIONS: list[tuple[str, str, list[str]]] = [
    (
        "The trainer and what `fit()` returns",
        "On the driver: `RayOrmasTrainer(...).fit()` returns Ray's `Result` with `.ormas`.",
        [
            "RayOrmasTrainer",
            "RayOrmasResult",
            "OrmasRun",
            "FleetSummary",
            "GoodputAccount",
            "RestartCost",
            "AttemptGoodput",
        ],
    ),
    (
        "Settings",
        "Validated on the driver when built (frozen), shipped to every rank; each is also a section "
        "of a `ray-ormas train` config (docs/cli.md).",
        ["MonitorSettings", "MLflowSettings", "FleetSettings", "PreflightSettings", "BatchSize"],
    ),
    (
        "Your own fleet rule",
        "A `FleetSettings(policy=...)` function runs on the head node at every complete check: it gets a "
        '`FleetView` and returns a `FleetAction` or None (docs/fleet-health.md, "When the fleet acts").',
        ["FleetView", "RankRow", "FleetAlarm", "FleetAction"],
    ),
    (
        "Inside the training loop",
        "On every worker, in the loop a `RayOrmasTrainer` runs.",
        [
            "prepare_model",
            "monitor",
            "WorkerMonitor",
            "report",
            "batch_size",
            "epochs",
            "no_sync",
            "save_checkpoint",
            "load_checkpoint",
            "TrainState",
        ],
    ),
    (
        "Framework callbacks",
        "Added on every rank without a change to the loop (docs/adoption.md); import them to choose "
        "their options. Each module needs its framework (`pip install 'ray-ormas[lightning]'`, "
        "`'ray-ormas[transformers]'`).",
        ["lightning.RayOrmasLightningCallback", "transformers.RayOrmasTransformersCallback"],
    ),
    (
        "The record, read back",
        "Anywhere: a run's records from local storage or object storage (docs/fault-tolerance.md).",
        ["open_records", "RunRecords", "Segment", "RecordStore"],
    ),
    (
        "Errors",
        "Every error a user can meet, under one base; each also subclasses the builtin it names, so "
        "`except ValueError` keeps working (`ray_ormas.errors`, also exported by `ray_ormas`).",
        [
            "RayOrmasError",
            "OptionError",
            "OptionTypeError",
            "ConfigError",
            "UsageError",
            "MissingExtraError",
            "CheckpointError",
            "CheckpointNotFoundError",
            "RecordStorageError",
            "StoragePathError",
            "JournalError",
            "RankMismatchError",
            "RankSyncTimeoutError",
            "FleetStopError",
            "FleetReattemptError",
            "OrmasCompatError",
            "RaySeamChanged",
        ],
    ),
]

HEADER = """# API reference

Every public name of ray-ormas: its signature and its docstring, generated from the code by
tests/api_reference.py ([contributing.md](contributing.md) has the command; the suite fails
when this file is out of date). How to use them: [quickstart.md](quickstart.md); the settings
as YAML: [cli.md](cli.md).
"""


def resolve(dotted: str) -> Any:
    """`Name` in `ray_ormas`, or `module.Name` in `ray_ormas.module`."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(f"ray_ormas.{module}" if module else "ray_ormas"), name)


def signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    fields = getattr(obj, "__pydantic_fields__", None)
    if isinstance(fields, dict):  # a required field shows no default, whichever pydantic release renders it
        params = [
            p.replace(default=inspect.Parameter.empty) if p.name in fields and fields[p.name].is_required() else p
            for p in sig.parameters.values()
        ]
        sig = sig.replace(parameters=params)
    text = str(sig)
    return re.sub(r" at 0x[0-9a-f]+", "", text).replace("ray_ormas._internal.", "")


def docstring(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def fields_table(cls: Any) -> list[str]:
    """A pydantic model's or dataclass's fields: name, type, default, description."""
    fields = getattr(cls, "__pydantic_fields__", None)
    if not fields:
        return []
    rows = ["| field | type | default | |", "|---|---|---|---|"]
    for name, info in fields.items():
        if info.default_factory is not None:
            default = f"{info.default_factory.__name__}()"
        elif info.is_required():
            default = "required"
        else:
            default = repr(info.default)
        annotation = re.sub(r"\b(typing|ray_ormas\._internal\.[\w.]+)\.", "", str(info.annotation))
        annotation = annotation.replace("<class '", "").replace("'>", "").replace("|", "\\|")
        description = (info.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{name}` | `{annotation}` | `{default}` | {description} |")
    return rows


def members(cls: Any) -> list[str]:
    """The public methods and properties a class defines itself (not those of its bases)."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_") or (dataclasses.is_dataclass(cls) and name in cls.__dataclass_fields__):
            continue
        if isinstance(value, property):
            out.append(f"* `.{name}`: {first_paragraph(value.fget)}")
        elif isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            out.append(f"* `.{name}{signature(function)}`: {first_paragraph(function)}")
    return out


def first_paragraph(obj: Any) -> str:
    return " ".join(docstring(obj).split("\n\n")[0].split()) or "(no docstring)"


def entry(dotted: str) -> list[str]:
    obj = resolve(dotted)
    shown = f"ray_ormas.{dotted}"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        return [f"### `{shown}({bases})`", "", docstring(obj), ""]
    lines = [f"### `{shown}{signature(obj)}`", "", docstring(obj), ""]
    if inspect.isclass(obj):
        table = fields_table(obj)
        listed = members(obj)
        lines += [*table, ""] if table else []
        lines += [*listed, ""] if listed else []
    return lines


def public_names() -> set[str]:
    import ray_ormas

    names = {n for n in ray_ormas.__all__ if not n.startswith("__")}
    return names | {"lightning.RayOrmasLightningCallback", "transformers.RayOrmasTransformersCallback"}


def render() -> str:
    out = [HEADER]
    for title, note, names in SECTIONS:
        out += [f"## {title}", "", textwrap.fill(note, 100), ""]
        for name in names:
            out += entry(name)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
