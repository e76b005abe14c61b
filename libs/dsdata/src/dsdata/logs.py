"""The `dsdata` logger: INFO lines on stderr (the analyzer's progress, new curriculum clusters)."""

from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    # The stderr of the moment, not of the import, so a later redirect (a test's capture) gets the lines.
    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


logger = logging.getLogger("dsdata")
if not logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[dsdata] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
