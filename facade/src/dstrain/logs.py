"""The `dstrain` logger: INFO lines on stderr from rank 0, as DeepSpeed's engine prints them."""

from __future__ import annotations

import logging

logger = logging.getLogger("dstrain")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[dstrain] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_on_rank0(rank: int, message: str) -> None:
    if rank == 0:
        logger.info(message)
