"""The `dstrain` logger: INFO lines on stderr from rank 0, as DeepSpeed's engine prints them."""

from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    # The stderr of the moment, not of the import: a later redirect (a test runner's capture, a
    # script's own) still gets the lines.
    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


logger = logging.getLogger("dstrain")
if not logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[dstrain] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_on_rank0(rank: int, message: str) -> None:
    if rank == 0:
        logger.info(message)


LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
              "critical": logging.CRITICAL}


def log_level_from_string(name: str) -> int:
    """"info" (any case) -> logging.INFO; anything else is refused, naming the levels."""
    level = LOG_LEVELS.get(str(name).lower())
    if level is None:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def set_log_level(name: str, target: logging.Logger | None = None) -> None:
    """The config's `log_level`: the dstrain logger (or `target`) and its handlers at that level."""
    target = target or logger
    level = log_level_from_string(name)
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)
