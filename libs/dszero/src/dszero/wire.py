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
    return start_reduce_scatter(flat, group, average=average, out=out, log_name=log_name).wait()


class PendingShard:
    """A reduce-scatter in flight: `wait()` completes it and returns this rank's shard of the result."""

    def __init__(self, handles: list[Any], result: torch.Tensor, divide_by: int = 1,
                 out: torch.Tensor | None = None):
        self.handles = [h for h in handles if h is not None]
        self.result, self.divide_by, self.out = result, divide_by, out

    def wait(self) -> torch.Tensor:
        for handle in self.handles:
            handle.wait()
        self.handles = []
        if self.divide_by != 1:
            self.result.div_(self.divide_by)
            self.divide_by = 1
        if self.out is not None and self.out is not self.result:
            self.result = self.out.copy_(self.result)
        return self.result


def start_reduce_scatter(flat: torch.Tensor, group: Any, *, average: bool, out: torch.Tensor | None = None,
                         log_name: str = "zero_reduce_scatter") -> PendingShard:
    """Launch `reduce_scatter` and return at once (the backend runs it beside the caller's compute).

    `flat` must stay untouched until `wait()`. out=None: the shard is returned as a view of `flat` (no
    copy); otherwise it is written to `out`. Every rank must start its reduce-scatters in one order."""
    world = dist.get_world_size(group)
    size = flat.numel() // world
    if world == 1:
        return PendingShard([], flat, out=out)
    op = dscomm.ReduceOp.AVG if average else dscomm.ReduceOp.SUM
    if not _gloo(group):
        target = out if out is not None else torch.empty(size, dtype=flat.dtype, device=flat.device)
        handle = dscomm.reduce_scatter_tensor(target, flat, op=op, group=group, async_op=True, log_name=log_name)
        return PendingShard([handle], target)
    rank = dist.get_rank(group)
    mine = flat[rank * size:(rank + 1) * size]
    if flat.numel() >= ALL_REDUCE_FROM:
        return PendingShard([dscomm.all_reduce(flat, op=op, group=group, async_op=True, log_name=log_name)], mine,
                            out=out)
    handles = [dscomm.reduce(flat[r * size:(r + 1) * size], _global(group, r), group=group, async_op=True,
                             log_name=log_name) for r in range(world)]
    return PendingShard(handles, mine, divide_by=world if average else 1, out=out)


def whole_slot(shard: torch.Tensor, layout: Any, slot: Any, group: Any) -> torch.Tensor:
    """A copy of one slot's elements of a flat tensor cut into `layout`'s shards over `group` (this rank's
    `shard`), gathered from every rank of the group; collective when the layout has several shards."""
    if layout.world_size == 1:
        return shard[slot.offset:slot.end].view(slot.shape).clone()
    full = torch.empty(layout.padded_numel, dtype=shard.dtype, device=shard.device)
    gather_shards(full, shard.contiguous(), group, log_name="zero_gather_fragment")
    return full[slot.offset:slot.end].view(slot.shape).clone()
