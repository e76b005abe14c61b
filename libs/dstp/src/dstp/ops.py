"""Tensor parallelism's region boundaries as torch.library operators a compiled graph can hold.

    torch.ops.dstp.copy_to_region(x, group_name)       # identity forward, input gradient all-reduced
    torch.ops.dstp.reduce_from_region(y, group_name)   # partial outputs all-reduced, gradient passed through

DeepCompile's autotp pass inserts them around the matmuls of the column- and row-parallel layers, once
`defer_collectives_to_compiler(model)` has turned the layers' own collectives off. The group travels by
its name (`group.group_name`); each operator has a fake implementation and its gradient registered.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

import dscomm

from .errors import TensorParallelError


def _group(name: str) -> Any:
    try:
        return _resolve_process_group(name)
    except (RuntimeError, ValueError) as exc:
        raise TensorParallelError(f"dstp's operators: no process group named {name!r} in this process ({exc})") \
            from None


def _all_reduced(x: torch.Tensor, group: str, log_name: str) -> torch.Tensor:
    out = x.contiguous().clone()
    dscomm.all_reduce(out, group=_group(group), log_name=log_name)
    return out


@torch.library.custom_op("dstp::copy_to_region", mutates_args=())
def copy_to_region_op(x: torch.Tensor, group: str) -> torch.Tensor:
    return x.clone()


@copy_to_region_op.register_fake
def _copy_shape(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("dstp::reduce_from_region", mutates_args=())
def reduce_from_region_op(y: torch.Tensor, group: str) -> torch.Tensor:
    return _all_reduced(y, group, "tp_row_all_reduce")


@reduce_from_region_op.register_fake
def _reduce_shape(y: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(y)


@torch.library.custom_op("dstp::all_reduce_gradient", mutates_args=())
def _all_reduce_gradient_op(grad: torch.Tensor, group: str) -> torch.Tensor:
    return _all_reduced(grad, group, "tp_input_grad_all_reduce")


@_all_reduce_gradient_op.register_fake
def _gradient_shape(grad: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(grad)


def _keep_group(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.group = inputs[1]


def _copy_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    return torch.ops.dstp.all_reduce_gradient(grad, ctx.group), None


def _reduce_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    return grad, None


copy_to_region_op.register_autograd(_copy_grad, setup_context=_keep_group)
reduce_from_region_op.register_autograd(_reduce_grad, setup_context=_keep_group)
