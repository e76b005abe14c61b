"""The differentiable all-to-all of Ulysses: split one dimension over the sequence ranks, join another.

`all_to_all(x, scatter_dim, gather_dim, group)` cuts `x` into `sp` equal pieces along `scatter_dim`,
sends piece j to rank j of `group`, and concatenates what arrives (in rank order) along `gather_dim`.
From sequence-sharded to head-sharded is scatter the heads, gather the sequence; the way back swaps
them, which is also the backward of each. Any layout works: the dimensions are arguments.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .errors import SequenceParallelError


def group_size(group: Any) -> int:
    return dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return dist.get_rank(group)


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    sp = group_size(group)
    if sp == 1:
        return x
    if x.shape[scatter_dim] % sp:
        raise SequenceParallelError(f"all-to-all over {sp} sequence ranks: dimension {scatter_dim} of a tensor of "
                                    f"shape {tuple(x.shape)} has {x.shape[scatter_dim]} entries, not a multiple of "
                                    f"{sp}")
    # [sp, ...piece]: piece j goes to rank j; one contiguous buffer each way.
    send = torch.stack(x.chunk(sp, dim=scatter_dim))
    received = torch.empty_like(send)
    dscomm.all_to_all_single(received, send, group=group, log_name="ulysses_all_to_all")
    # received[j] came from rank j: it is the j-th block along gather_dim.
    joined = received.movedim(0, gather_dim)
    shape = list(x.shape)
    shape[scatter_dim] //= sp
    shape[gather_dim] *= sp
    return joined.reshape(shape)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _AllToAll.apply(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Differentiable: split `scatter_dim` over `group`, join `gather_dim` (negative dims count from the end)."""
    ndim = x.dim()
    scatter_dim, gather_dim = scatter_dim % ndim, gather_dim % ndim
    if scatter_dim == gather_dim:
        raise SequenceParallelError(f"all-to-all: scatter and gather dimension are both {scatter_dim}; they must "
                                    f"differ (heads and sequence)")
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherSequence(torch.autograd.Function):
    """All-gather along a dimension; backward keeps this rank's slice of the summed gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x) for _ in range(group_size(group))]
        dscomm.all_gather(parts, x.contiguous(), group=group, log_name="ulysses_all_gather")
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        dscomm.all_reduce(grad, group=ctx.group, log_name="ulysses_gather_backward")
        return grad.chunk(group_size(ctx.group), dim=ctx.dim)[group_rank(ctx.group)].contiguous(), None, None


def gather_sequence(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """The whole sequence from every rank's slice (equal slices, in rank order); differentiable."""
    if group_size(group) == 1:
        return x
    return _GatherSequence.apply(x, dim % x.dim(), group)


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) on every rank; backward sums the gradients of every rank's copy (as
    torch.distributed.nn's all_reduce)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dscomm.all_reduce(out, group=group, log_name="ulysses_loss_sum")
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dscomm.all_reduce(grad, group=ctx.group, log_name="ulysses_loss_sum_backward")
        return grad, None


def sum_over_ranks(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The sum of `x` over `group`, on every rank. Every rank then holds the same value and back-propagates
    it, so each rank's own term gets the gradients of all `sp` copies: with gradients averaged over the
    sequence ranks afterwards (ZeRO's sequence x data group), the result is the gradient of the sum."""
    if group_size(group) == 1:
        return x
    return _SumOverRanks.apply(x, group)
