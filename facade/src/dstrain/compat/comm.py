"""`dstrain.comm`: DeepSpeed's `deepspeed.comm`: dscomm's collectives and logging, plus the group and
process-group helpers DeepSpeed scripts call (new_group, get_global_rank, destroy_process_group, ...)."""

from __future__ import annotations

from typing import Any

import torch.distributed as _dist

import dscomm as _dscomm
from dscomm import *  # noqa: F403
from dscomm import __all__ as _dscomm_all


def new_group(ranks: list[int] | None = None, timeout: Any = None, backend: Any = None) -> Any:
    """A process group of `ranks` (collective: every rank calls it, as torch.distributed.new_group)."""
    return _dist.new_group(ranks=ranks, timeout=timeout, backend=backend)


def get_global_rank(group: Any, group_rank: int) -> int:
    return _dist.get_global_rank(group, group_rank)


def get_all_ranks_from_group(group: Any = None) -> list[int]:
    return _dist.get_process_group_ranks(group if group is not None else _dist.group.WORLD)


def get_world_group() -> Any:
    return _dist.group.WORLD


def destroy_process_group(group: Any = None) -> None:
    """The default group (and dscomm's cached groups) when `group` is None, else that group."""
    if group is None:
        _dscomm.destroy()
    else:
        _dist.destroy_process_group(group)


def is_available() -> bool:
    return _dist.is_available()


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    _dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def inference_all_reduce(tensor: Any, op: Any = None, group: Any = None) -> Any:
    return _dscomm.all_reduce(tensor, op=op if op is not None else _dscomm.ReduceOp.SUM, group=group)


def has_all_gather_into_tensor() -> bool:
    return True


def has_reduce_scatter_tensor() -> bool:
    return True


__all__ = [*_dscomm_all, "destroy_process_group", "get_all_ranks_from_group", "get_global_rank", "get_world_group",
           "has_all_gather_into_tensor", "has_reduce_scatter_tensor", "inference_all_reduce", "is_available",
           "monitored_barrier", "new_group"]
