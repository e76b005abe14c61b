"""Ulysses' collectives as torch.library operators a compiled graph can hold (AutoSP inserts them).

    torch.ops.dsseq.all_to_all(x, scatter_dim, gather_dim, group_name)   # as dsseq.all_to_all
    torch.ops.dsseq.sum_over_ranks(x, group_name)                        # as dsseq.sum_over_ranks

The group travels by its name (`group.group_name`), which is how a graph can name a process group;
each operator has a fake (shape-only) implementation for tracing and its gradient registered, so dynamo,
AOT autograd and inductor carry it and derive the backward graph themselves.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

import dscomm

from .comm import _exchange
from .errors import SequenceParallelError


def group_name(group: Any) -> str:
    """The name under which the operators find `group` (the default group's too)."""
    return (group if group is not None else dist.group.WORLD).group_name


def _group(name: str) -> Any:
    try:
        return _resolve_process_group(name)
    except (RuntimeError, ValueError) as exc:
        raise SequenceParallelError(f"dsseq's operators: no process group named {name!r} in this process ({exc}); "
                                    f"the graph was built for another world") from None


@torch.library.custom_op("dsseq::all_to_all", mutates_args=())
def all_to_all_op(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: str) -> torch.Tensor:
    return _exchange(x.contiguous(), scatter_dim, gather_dim, _group(group))


@all_to_all_op.register_fake
def _all_to_all_shape(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: str) -> torch.Tensor:
    sp = dist.get_world_size(_group(group))
    shape = list(x.shape)
    shape[scatter_dim] = shape[scatter_dim] // sp
    shape[gather_dim] = shape[gather_dim] * sp
    return x.new_empty(shape)


def _all_to_all_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.dims = inputs[1:]


def _all_to_all_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    scatter_dim, gather_dim, group = ctx.dims
    return torch.ops.dsseq.all_to_all(grad, gather_dim, scatter_dim, group), None, None, None


all_to_all_op.register_autograd(_all_to_all_grad, setup_context=_all_to_all_setup)


@torch.library.custom_op("dsseq::sum_over_ranks", mutates_args=())
def sum_over_ranks_op(x: torch.Tensor, group: str) -> torch.Tensor:
    out = x.clone()
    dscomm.all_reduce(out, group=_group(group), log_name="ulysses_loss_sum")
    return out


@sum_over_ranks_op.register_fake
def _sum_shape(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(x)


def _sum_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.group = inputs[1]


def _sum_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    # Every rank back-propagates its copy of the sum: each term gets all of their gradients (comm.py).
    return torch.ops.dsseq.sum_over_ranks(grad, ctx.group), None


sum_over_ranks_op.register_autograd(_sum_grad, setup_context=_sum_setup)
