"""ray-ormas's messages: the `ray_ormas.*` loggers and the default handler that shows them.

Every message of the package goes through a `ray_ormas.<part>` logger, taken with `get_logger`,
which starts each message with "[ray-ormas] " (and "rank N: " when the call says `rank=N`): the
prefixes come from here, not from each message.

Like Python's own last-resort handler, but from INFO up, the handler installed on the
`ray_ormas` logger shows a record only when the process has configured no logging of its own (no
handler on the root logger). So a user who never touches `logging` sees the lines on the driver, in the
workers' logs (which Ray forwards to the driver) and from the run ledger on the head node; a user
who configures logging (or pytest's `caplog`) gets the records through that configuration, once.

INFO records go to stdout (progress lines, notes), WARNING and above to stderr. The stream is
looked up when the record is written, because Ray Train replaces a worker's streams after
import. Quieter: `logging.getLogger("ray_ormas").setLevel(logging.WARNING)`; no progress lines:
the same on `ray_ormas.progress`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, MutableMapping

ROOT_LOGGER = "ray_ormas"
PREFIX = "[ray-ormas] "


class PrefixedLogger(logging.LoggerAdapter):
    """A `ray_ormas.*` logger whose messages start with "[ray-ormas] ", then "rank N: " when the call
    passes `rank=N` (`logger.warning("could not ...", rank=3)`)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        rank = kwargs.pop("rank", None)
        return f"{PREFIX}{'' if rank is None else f'rank {rank}: '}{msg}", kwargs


def get_logger(name: str) -> PrefixedLogger:
    """The logger `name` (under `ray_ormas`), with ray-ormas's prefixes."""
    return PrefixedLogger(name)


class DefaultHandler(logging.Handler):
    """Shows ray-ormas's records when nothing else in the process would (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # the process configured logging: it shows the record
            return
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def install_default_handler() -> None:
    """Once per process: the default handler on the `ray_ormas` logger, which logs from INFO."""
    logger = logging.getLogger(ROOT_LOGGER)
    if not any(isinstance(h, DefaultHandler) for h in logger.handlers):
        logger.addHandler(DefaultHandler())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
