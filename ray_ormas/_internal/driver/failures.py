"""Why a fit failed, in one paragraph: the root cause, without Ray's stack.

Ray Train wraps what went wrong: the loop's own exception sits in a `WorkerGroupError`'s
`worker_failures` (per rank), a controller failure in a `ControllerError`, an actor that died in
its constructor in an `ActorDiedError` whose message embeds the whole remote traceback, and a
remote task's exception in a `RayTaskError.cause`. `describe_failure` walks down to the root
and says it in one paragraph, `Type: message` per failed rank; the full stacks stay in Ray's
own log output and in the record's `run_end`.

Hooks relied on: `ray.train.WorkerGroupError.worker_failures`,
`ray.train.ControllerError.controller_failure`, `ray.exceptions.RayTaskError.cause`, and the
text of `ActorDiedError` (its last `Type: message` line is the constructor's error), read by
seams/ray_train.py's `remote_error_line`.
"""

from __future__ import annotations

from typing import Iterator

from ray_ormas._internal.seams.ray_train import remote_error_line
from ray_ormas.errors import FleetStopError

MAX_MESSAGE = 600


def root_causes(error: BaseException) -> dict[int | None, BaseException]:
    """The root exception(s) of `error`: per failed rank for a worker-group failure (rank ->
    exception), else one under the key None."""
    failures = getattr(error, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        return {rank: _innermost(e) for rank, e in sorted(failures.items())}
    return {None: _innermost(error)}


def describe_failure(error: BaseException) -> str:
    """One paragraph: what failed, on which ranks, `Type: message` of each root cause."""
    causes = root_causes(error)
    by_text: dict[str, list[int | None]] = {}
    for rank, cause in causes.items():
        by_text.setdefault(one_line(cause), []).append(rank)
    parts = []
    for text, ranks in by_text.items():
        where = (
            "" if ranks == [None] else f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}: "
        )
        parts.append(where + text)
    return "; ".join(parts)


def fleet_stop(error: BaseException) -> FleetStopError | None:
    """The `FleetStopError` an alarm's `stop` action raised in the controller's callback (Ray
    wraps it in a `ControllerError`), or that a rank raised; None for any other failure."""
    for inner in every_wrapped(error):
        if isinstance(inner, FleetStopError):
            return inner
    return None


def one_line(error: BaseException) -> str:
    """`Type: message`, the message cut to its meaningful part (a remote traceback's last line)."""
    text = str(error).strip()
    remote = remote_error_line(text)  # a remote traceback's last `Type: message` (seams/ray_train.py)
    if remote is not None:
        return _cut(remote)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    message = " ".join(line.strip() for line in lines) if lines else ""
    name = type(error).__name__
    return _cut(f"{name}: {message}" if message else name)


def wrapped(error: BaseException, *, context: bool = True) -> list[BaseException]:
    """The exceptions `error` wraps, the most telling first: Ray Train's `controller_failure`, a
    `RayTaskError`'s `cause`, `__cause__`, and (with `context`) `__context__`."""
    links = [getattr(error, "controller_failure", None), getattr(error, "cause", None), error.__cause__]
    if context:
        links.append(error.__context__)
    return [e for e in links if isinstance(e, BaseException)]


def every_wrapped(error: BaseException) -> Iterator[BaseException]:
    """`error` and every exception it wraps, however deep, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) not in seen:
            seen.add(id(e))
            yield e
            todo += wrapped(e)


def _innermost(error: BaseException) -> BaseException:
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = wrapped(error, context=False)
        if not inner:
            break
        error = inner[0]
    return error


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
