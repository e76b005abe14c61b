"""Experts split over ranks that hold the same tokens (AutoEP beside AutoTP, its expert-parallel group the
tensor-parallel group): no token moves. Every rank routes every token alike, computes the copies routed to
its own experts, and the partial outputs are summed over the group.

The two regions of Megatron's tensor parallelism make the gradients whole: what enters the experts
(the tokens and the routing weights) is the same on every rank, but each rank's experts see only their
share of it, so its gradient is summed over the group on the way back (`enter_shares`); the partial
outputs are summed on the way out and their gradient, the same on every rank, passes back as it is
(`sum_shares`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm


class _EnterShares(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dscomm.all_reduce(grad, group=ctx.group, log_name="autoep_replicated_grad")
        return grad, None


class _SumShares(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        total = tensor.contiguous().clone()
        dscomm.all_reduce(total, group=group, log_name="autoep_replicated_sum")
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        return grad, None


def enter_shares(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """`tensor` as it is; its gradient summed over `group` (each rank's experts used a share of it)."""
    return tensor if dist.get_world_size(group) == 1 else _EnterShares.apply(tensor, group)


def sum_shares(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's partial `tensor` summed over `group`; its gradient passes back unchanged."""
    return tensor if dist.get_world_size(group) == 1 else _SumShares.apply(tensor, group)
