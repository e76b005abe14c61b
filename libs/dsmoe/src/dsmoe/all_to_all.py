"""All-to-all over the expert-parallel group, differentiable: the backward pass sends the gradients
back the way the forward pass sent the tokens (the same collective with the splits swapped)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any, output_splits: list[int] | None,
                input_splits: list[int] | None) -> torch.Tensor:
        ctx.group, ctx.output_splits, ctx.input_splits = group, output_splits, input_splits
        return _exchange(tensor, group, output_splits, input_splits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        return _AllToAll.apply(grad, ctx.group, ctx.input_splits, ctx.output_splits), None, None, None


def _exchange(tensor: torch.Tensor, group: Any, output_splits: list[int] | None,
              input_splits: list[int] | None) -> torch.Tensor:
    tensor = tensor.contiguous()
    rows = sum(output_splits) if output_splits is not None else tensor.shape[0]
    out = tensor.new_empty((rows, *tensor.shape[1:]))
    dscomm.all_to_all_single(out, tensor, output_splits, input_splits, group=group, log_name="moe_all_to_all")
    return out


def all_to_all(tensor: torch.Tensor, group: Any, output_split_sizes: list[int] | None = None,
               input_split_sizes: list[int] | None = None) -> torch.Tensor:
    """Rows [sum(input_split_sizes)] of `tensor` to the ranks of `group`: the i-th block of
    input_split_sizes[i] rows goes to rank i, and the result holds output_split_sizes[j] rows from
    each rank j. Without sizes, dimension 0 splits equally. A one-rank group returns `tensor` as is."""
    if dist.get_world_size(group) == 1:
        return tensor
    return _AllToAll.apply(tensor, group, output_split_sizes, input_split_sizes)


def exchange_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """Each rank's `counts` (one int per expert, experts in ep-rank order) sent in equal blocks: what
    every rank will send to this rank's experts, [ranks x local experts] flattened (no gradient)."""
    if dist.get_world_size(group) == 1:
        return counts
    received = torch.empty_like(counts)
    dscomm.all_to_all_single(received, counts.contiguous(), group=group, log_name="moe_all_to_all_counts")
    return received
