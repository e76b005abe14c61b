"""Column- and row-parallel linear layers that take over an nn.Linear's own parameters (already cut),
so state_dict keys and any references to the parameters stay as they were."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .comm import TensorGroup


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output rows (and b) cut over the group: enters the region (input
    gradient all-reduced) and returns this rank's output columns, or all of them with gather_output."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, tensor_group: TensorGroup, *,
                 gather_output: bool = False, in_features: int | None = None, out_features: int | None = None):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.tensor_group = tensor_group
        self.gather_output = gather_output
        self.in_features = in_features or weight.shape[1]
        self.out_features = out_features or weight.shape[0] * tensor_group.size  # the whole layer's, as nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(self.tensor_group.copy_to_region(x), self.weight, self.bias)
        return self.tensor_group.gather_last_dim(y) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (local {self.weight.shape[0]}), "
                f"bias={self.bias is not None}, tp={self.tensor_group.size}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r W_r^T, plus b once: W's input columns are cut over the group; the
    input is this rank's slice (or whole, with split_input, and sliced here)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, tensor_group: TensorGroup, *,
                 split_input: bool = False, in_features: int | None = None, out_features: int | None = None):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.tensor_group = tensor_group
        self.split_input = split_input
        self.in_features = in_features or weight.shape[1] * tensor_group.size
        self.out_features = out_features or weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split_input:
            x = self.tensor_group.slice_last_dim(x)
        y = self.tensor_group.reduce_from_region(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (local {self.weight.shape[1]}), out_features={self.out_features}, "
                f"bias={self.bias is not None}, tp={self.tensor_group.size}, split_input={self.split_input}")


def wrap_region(module: nn.Module, tensor_group: TensorGroup, *, enters: bool, leaves: bool) -> list[Any]:
    """A module that uses its cut parameters itself (3-D expert weights): its differentiable inputs enter
    the region and its output leaves it. Returns the hook handles."""
    handles = []
    if enters:
        def enter(_module, args, kwargs):
            # Every differentiable input (hidden states, and router weights that scale the experts' outputs)
            # gets a partial gradient on each rank, so each enters the region.
            def entered(value):
                if torch.is_tensor(value) and value.is_floating_point() and value.requires_grad:
                    return tensor_group.copy_to_region(value)
                return value
            return tuple(entered(v) for v in args), {k: entered(v) for k, v in kwargs.items()}
        handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
    if leaves:
        def leave(_module, _args, output):
            if torch.is_tensor(output):
                return tensor_group.reduce_from_region(output)
            if isinstance(output, tuple) and output and torch.is_tensor(output[0]):
                return (tensor_group.reduce_from_region(output[0]), *output[1:])
            return None
        handles.append(module.register_forward_hook(leave))
    return handles
