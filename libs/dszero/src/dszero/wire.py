"""How a buffer split evenly over the ranks is gathered and reduce-scattered on this backend.

NCCL's all-gather and reduce-scatter are the cheapest way to do both. Gloo's are not: on a 2-rank
CPU group, measured on 27M fp32 elements, `all_gather_into_tensor` took 127 ms where one
`broadcast` per rank of its own shard took 35 ms, and `reduce_scatter_tensor` took 160 ms where
one ring `all_reduce` of the whole buffer took 76 ms (102 ms as one `reduce` per owner; on 1M
elements the per-owner reduce is fastest, 3.0 ms against 7.3). So on gloo the same results are
built from those ops. Every rank issues the same ops in the same order, as the native ones would.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm

# Above this many elements a whole-buffer all-reduce beats one reduce per owner on gloo.
ALL_REDUCE_FROM = 8_000_000


def _gloo(group: Any) -> bool:
    return dist.get_backend(group) == "gloo"


def _global(group: Any, rank: int) -> int:
    return dist.get_global_rank(group, rank) if group is not None else rank


class Handles:
    """Several async ops waited as one."""

    def __init__(self, handles: list[Any]):
        self.handles = [h for h in handles if h is not None]

    def wait(self) -> None:
        for handle in self.handles:
            handle.wait()
        self.handles = []


def gather_shards(full: torch.Tensor, shard: torch.Tensor, group: Any, *, async_op: bool = False,
                  log_name: str = "zero_gather") -> Handles | None:
    """`full` = every rank's `shard`, concatenated in rank order (an all-gather)."""
    world = dist.get_world_size(group)
    if world == 1:
        full.copy_(shard)
        return Handles([]) if async_op else None
    if not _gloo(group):
        if shard.data_ptr() == full.data_ptr() + dist.get_rank(group) * shard.numel() * shard.element_size():
            shard = shard.clone()  # this rank's slot of `full` itself: the native op wants them apart
        handle = dscomm.all_gather_into_tensor(full, shard, group=group, async_op=async_op, log_name=log_name)
        return Handles([handle]) if async_op else None
    size = shard.numel()
    rank = dist.get_rank(group)
    full[rank * size:(rank + 1) * size].copy_(shard)  # a no-op when the shard is that slot already
    handles = [dscomm.broadcast(full[r * size:(r + 1) * size], _global(group, r), group=group, async_op=async_op,
                                log_name=log_name) for r in range(world)]
    return Handles(handles) if async_op else None


def reduce_scatter(out: torch.Tensor, flat: torch.Tensor, group: Any, *, average: bool,
                   log_name: str = "zero_reduce_scatter") -> torch.Tensor:
    """This rank's shard of the sum (or mean) of `flat` over the ranks, written to `out` and returned.

    `flat` may be overwritten (on gloo it is reduced in place).
    """
    world = dist.get_world_size(group)
    if world == 1:
        return out.copy_(flat)
    if not _gloo(group):
        op = dscomm.ReduceOp.AVG if average else dscomm.ReduceOp.SUM
        dscomm.reduce_scatter_tensor(out, flat, op=op, group=group, log_name=log_name)
        return out
    size = out.numel()
    rank = dist.get_rank(group)
    if flat.numel() >= ALL_REDUCE_FROM:
        op = dscomm.ReduceOp.AVG if average else dscomm.ReduceOp.SUM
        dscomm.all_reduce(flat, op=op, group=group, log_name=log_name)
    else:
        for r in range(world):
            dscomm.reduce(flat[r * size:(r + 1) * size], _global(group, r), group=group, log_name=log_name)
        if average:
            flat[rank * size:(rank + 1) * size].div_(world)
    return out.copy_(flat[rank * size:(rank + 1) * size])


def whole_slot(shard: torch.Tensor, layout: Any, slot: Any, group: Any) -> torch.Tensor:
    """A copy of one slot's elements of a flat tensor cut into `layout`'s shards over `group` (this rank's
    `shard`), gathered from every rank of the group; collective when the layout has several shards."""
    if layout.world_size == 1:
        return shard[slot.offset:slot.end].view(slot.shape).clone()
    full = torch.empty(layout.padded_numel, dtype=shard.dtype, device=shard.device)
    gather_shards(full, shard.contiguous(), group, log_name="zero_gather_fragment")
    return full[slot.offset:slot.end].view(slot.shape).clone()
