"""ray-ormas's messages: the `ray_ormas.*` loggers and the default handler that shows them.

Every message of the package goes through `logging.getLogger("ray_ormas.<module>")`. Like
Python's own last-resort handler, but from INFO up, the handler installed on the `ray_ormas`
logger shows a record only when the process has configured no logging of its own (no handler on
the root logger). So a user who never touches `logging` sees the lines on the driver, in the
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

ROOT_LOGGER = "ray_ormas"


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
