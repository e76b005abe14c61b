"""`dstrain.utils`: DeepSpeed's `deepspeed.utils` names that training scripts import.

    from dstrain.utils import logger, log_dist, RepeatingLoader, groups, safe_get_full_fp32_param
    from dstrain.utils import set_z3_leaf_modules    # ZeRO-3 leaf modules (dszero.leaf_modules)
    from dstrain.utils import safe_get_local_grad, safe_set_full_grad   # dszero.fragments
"""

from __future__ import annotations

import logging as _logging  # `logging` is this package's submodule (deepspeed.utils.logging)
from collections.abc import Iterable

from dscomm import groups
from dsmonitor import SynchronizedWallClockTimer
from dszero import (
    get_z3_leaf_modules,
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_grad,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_grad,
    safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
    set_z3_leaf_modules,
    unset_z3_leaf_modules,
)
from dszero.leaf_modules import (
    set_z3_leaf_module,
    set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix,
    z3_leaf_module,
    z3_leaf_parameter,
)

from ...engine.dataloader import RepeatingLoader
from ...logs import logger


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = _logging.INFO) -> None:
    """Log `message` on the given ranks (None or [-1]: every rank), prefixed with the rank, as DeepSpeed does."""
    import dscomm

    rank = dscomm.get_rank() if dscomm.is_initialized() else 0
    wanted = set(ranks) if ranks is not None else {-1}
    if -1 in wanted or rank in wanted:
        logger.log(level, f"[Rank {rank}] {message}")


__all__ = ["RepeatingLoader", "SynchronizedWallClockTimer", "get_z3_leaf_modules", "groups", "log_dist", "logger",
           "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state", "safe_get_local_fp32_param",
           "safe_get_local_grad", "safe_get_local_optimizer_state", "safe_set_full_fp32_param", "safe_set_full_grad",
           "safe_set_full_optimizer_state", "safe_set_local_fp32_param", "safe_set_local_grad",
           "safe_set_local_optimizer_state", "safe_update_full_grad_vectorized",
           "set_z3_leaf_module", "set_z3_leaf_modules", "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix",
           "unset_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]
