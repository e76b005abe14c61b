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
