"""The collectives of tensor parallelism, as autograd functions over one tensor group.

Megatron's pair: entering a column-parallel region is the identity forward and an all-reduce of the
input gradient backward (`copy_to_region`); leaving a row-parallel region all-reduces the partial
outputs forward and passes the gradient through backward (`reduce_from_region`). With overlap on
(tp_overlap_comm), both all-reduces are issued asynchronously and the half-batch that is running
hands over to the other half before waiting (see overlap.py). The time each rank spends blocked in
these collectives is counted (`TensorGroup.clock`): the exposed communication.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .overlap import HalfBatchOverlap


class CommClock:
    """Seconds spent blocked in tensor-parallel collectives, and how many there were."""

    def __init__(self) -> None:
        self.blocked_s = 0.0
        self.collectives = 0

    def reset(self) -> None:
        self.blocked_s, self.collectives = 0.0, 0

    def blocked(self, start: float) -> None:
        self.blocked_s += time.perf_counter() - start


class TensorGroup:
    """One model's tensor-parallel group: its process group, this rank's place, the clock, and the
    half-batch scheduler when tp_overlap_comm is on. Layers hold a reference; there is no global state."""

    def __init__(self, group: Any, *, overlap: bool = False) -> None:
        self.group = group
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.clock = CommClock()
        self.overlap = HalfBatchOverlap() if overlap else None
        self._shared_inputs: dict[Any, tuple[Any, torch.Tensor]] = {}
        # True while a compiler emits the region boundaries itself (DeepCompile's autotp pass: ops.py):
        # the layers then leave their inputs and outputs as they are.
        self.in_graph = False

    @property
    def group_name(self) -> str:
        """The name under which dstp's graph operators (ops.py) find this process group."""
        return (self.group if self.group is not None else dist.group.WORLD).group_name

    # ------------------------------------------------------------------ blocking and asynchronous all-reduce
    def all_reduce(self, tensor: torch.Tensor, log_name: str = "tp_all_reduce") -> None:
        start = time.perf_counter()
        dscomm.all_reduce(tensor, group=self.group, log_name=log_name)
        self.clock.collectives += 1
        self.clock.blocked(start)

    def all_reduce_async(self, tensor: torch.Tensor, log_name: str = "tp_all_reduce") -> Any:
        self.clock.collectives += 1
        return dscomm.all_reduce(tensor, group=self.group, async_op=True, log_name=log_name)

    def wait(self, handle: Any) -> None:
        start = time.perf_counter()
        handle.wait()
        self.clock.blocked(start)

    def in_halves(self) -> bool:
        return self.overlap is not None and self.overlap.running()

    # ------------------------------------------------------------------ the region boundaries
    def copy_to_region(self, x: torch.Tensor) -> torch.Tensor:
        """Enter a column-parallel region. Consecutive layers fed the same tensor (q, k and v; gate and
        up) share one entry, so their input gradients are summed before one all-reduce."""
        if self.size == 1 or self.in_graph or not (torch.is_grad_enabled() and x.requires_grad):
            return x
        key = self.overlap.current_half() if self.overlap is not None else None
        cached = self._shared_inputs.get(key)
        if cached is not None and cached[0]() is x:
            return cached[1]
        original = x
        if self.in_halves():
            box: dict[str, Any] = {}
            x = _WaitForGradient.apply(x, self, box)
            self.overlap.hand_over()  # the other half creates its wait node too: backward interleaves the halves
            entered = _CopyToRegion.apply(x, self, box)
        else:
            entered = _CopyToRegion.apply(x, self, None)
        self._shared_inputs[key] = (weakref.ref(original), entered)
        return entered

    def reduce_from_region(self, y: torch.Tensor) -> torch.Tensor:
        """Leave a row-parallel region: sum the partial outputs over the group (in place)."""
        if self.size == 1 or self.in_graph:
            return y
        # The gradient passes through unchanged, so the sum runs on the data outside autograd.
        if self.in_halves():
            handle = self.all_reduce_async(y.detach(), "tp_row_all_reduce")
            self.overlap.hand_over()  # the other half computes while this all-reduce is in flight
            self.wait(handle)
        else:
            self.all_reduce(y.detach(), "tp_row_all_reduce")
        return y

    def gather_last_dim(self, y: torch.Tensor) -> torch.Tensor:
        """Every rank's slice of the last dimension, concatenated (column layers with gather_output)."""
        return _GatherLastDim.apply(y, self) if self.size > 1 else y

    def slice_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a whole input (row layers with split_input)."""
        return _SliceLastDim.apply(x, self) if self.size > 1 else x


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tensor_group, box):
        ctx.tensor_group, ctx.box = tensor_group, box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if ctx.box is None:
            ctx.tensor_group.all_reduce(grad, "tp_input_grad_all_reduce")
        else:  # the wait node before this one waits, after the other half's work in between
            ctx.box["handle"] = ctx.tensor_group.all_reduce_async(grad, "tp_input_grad_all_reduce")
        return grad, None, None


class _WaitForGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tensor_group, box):
        ctx.tensor_group, ctx.box = tensor_group, box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        handle = ctx.box.pop("handle", None)
        if handle is not None:
            ctx.tensor_group.wait(handle)
        return grad, None, None


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, tensor_group):
        ctx.tensor_group = tensor_group
        y = y.contiguous()
        parts = [torch.empty_like(y) for _ in range(tensor_group.size)]
        start = time.perf_counter()
        dscomm.all_gather(parts, y, group=tensor_group.group, log_name="tp_gather_output")
        tensor_group.clock.collectives += 1
        tensor_group.clock.blocked(start)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.tensor_group
        return grad.chunk(group.size, dim=-1)[group.rank].contiguous(), None


class _SliceLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tensor_group):
        ctx.tensor_group = tensor_group
        return x.chunk(tensor_group.size, dim=-1)[tensor_group.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        group = ctx.tensor_group
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(group.size)]
        start = time.perf_counter()
        dscomm.all_gather(parts, grad, group=group.group, log_name="tp_split_input_grad")
        group.clock.collectives += 1
        group.clock.blocked(start)
        return torch.cat(parts, dim=-1), None
