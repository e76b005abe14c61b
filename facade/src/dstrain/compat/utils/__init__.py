"""`dstrain.utils`: DeepSpeed's `deepspeed.utils` names that training scripts import.

    from dstrain.utils import logger, log_dist, RepeatingLoader, groups, safe_get_full_fp32_param
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dscomm import groups
from dsmonitor import SynchronizedWallClockTimer
from dszero import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_set_full_fp32_param,
)

from ...engine.dataloader import RepeatingLoader
from ...logs import logger


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = logging.INFO) -> None:
    """Log `message` on the given ranks (None or [-1]: every rank), prefixed with the rank, as DeepSpeed does."""
    import dscomm

    rank = dscomm.get_rank() if dscomm.is_initialized() else 0
    wanted = set(ranks) if ranks is not None else {-1}
    if -1 in wanted or rank in wanted:
        logger.log(level, f"[Rank {rank}] {message}")


__all__ = ["RepeatingLoader", "SynchronizedWallClockTimer", "groups", "log_dist", "logger", "safe_get_full_fp32_param",
           "safe_get_full_grad", "safe_get_full_optimizer_state", "safe_set_full_fp32_param"]
