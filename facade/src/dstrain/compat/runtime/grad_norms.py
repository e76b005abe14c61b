"""`deepspeed.runtime.utils`' gradient helpers for scripts that clip or check gradients themselves (Megatron-style
loops): `clip_grad_norm_`, `get_weight_norm`, `get_global_norm` and `CheckOverflow`, with DeepSpeed's rules for
model-parallel and expert (MoE) parameters.

- Tensor-parallel ranks each hold part of the model: a weight split over them (`is_model_parallel_parameter`) is
  counted on every rank, a replicated one only on tensor-parallel rank 0, and the sums meet over `mpu`'s model group.
- An expert parameter (`param.allreduce is False`) has different gradients on each data-parallel rank, so the norm
  `clip_grad_norm_` clips by is the mean of the ranks' norms (every rank then clips by the same factor), and an
  overflow anywhere in an expert group is an overflow on all of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

import dscomm
from dscomm import groups as parallel_groups

_INF = float("inf")


def is_model_parallel_parameter(param: Any) -> bool:
    """Whether `param` is one shard of a weight split over the tensor (model) parallel ranks: cut by AutoTP
    (dscomm.is_tensor_parallel), or marked so by Megatron (`tensor_model_parallel` / `model_parallel`)."""
    return dscomm.is_tensor_parallel(param) or any(
        bool(getattr(param, attr, False)) for attr in ("tensor_model_parallel", "model_parallel"))


def is_moe_param(param: Any) -> bool:
    """An expert's parameter: DeepSpeed's MoE layers mark them `allreduce = False` (they are not averaged over
    the data-parallel ranks)."""
    return getattr(param, "allreduce", True) is False


def _as_list(parameters: Any) -> list:
    return [parameters] if torch.is_tensor(parameters) else list(parameters)


def _counted_here(param: Any, mpu: Any) -> bool:
    """Whether this rank counts `param` in a norm: replicated weights once per tensor-parallel group."""
    if mpu is None:
        return True
    return mpu.get_model_parallel_rank() == 0 or is_model_parallel_parameter(param)


def _finite_or_minus_one(value: float) -> float:
    return value if math.isfinite(value) else -1.0


def get_global_norm(norm_list: Iterable[float]) -> float:
    """The 2-norm of norms: sqrt of the sum of their squares."""
    return math.sqrt(sum(float(norm) ** 2 for norm in norm_list))


def get_weight_norm(parameters: Any, norm_type: float = 2, mpu: Any = None) -> float:
    """The `norm_type`-norm of the parameters' values (tensors are taken as they are), summed over `mpu`'s
    model-parallel group; -1 when it is not finite (DeepSpeed's overflow mark)."""
    params = _as_list(parameters)
    norm_type = float(norm_type)
    if norm_type == _INF:
        local = max((float(p.data.abs().max()) for p in params), default=0.0)
        total = torch.tensor([local], dtype=torch.float32)
        if mpu is not None:
            dscomm.all_reduce(total, op=dscomm.ReduceOp.MAX, group=mpu.get_model_parallel_group())
        return _finite_or_minus_one(float(total[0]))
    local = 0.0
    for param in params:
        if getattr(param, "ds_pipe_replicated", False) or not _counted_here(param, mpu):
            continue
        local += float(param.data.float().norm(norm_type)) ** norm_type
    total = torch.tensor([local], dtype=torch.float32)
    if mpu is not None:
        dscomm.all_reduce(total, op=dscomm.ReduceOp.SUM, group=mpu.get_model_parallel_group())
    return _finite_or_minus_one(float(total[0]) ** (1.0 / norm_type))


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2, mpu: Any = None) -> torch.Tensor:
    """Scale the parameters' gradients in place so their total `norm_type`-norm is at most `max_norm`, as
    torch.nn.utils.clip_grad_norm_ does, counting model-parallel shards once and averaging the norm over the
    data-parallel ranks (expert gradients differ between them). Returns the total norm (a 1-element tensor)."""
    params = [p for p in _as_list(parameters) if p.grad is not None]
    if not params:
        return torch.zeros(1)
    norm_type = float(norm_type)
    if norm_type == _INF:
        total = torch.stack([p.grad.detach().abs().max().float() for p in params]).max().reshape(1)
        if mpu is not None:
            dscomm.all_reduce(total, op=dscomm.ReduceOp.MAX, group=mpu.get_model_parallel_group())
    else:
        norms = [p.grad.detach().float().norm(norm_type) for p in params if _counted_here(p, mpu)]
        total = (torch.stack(norms).square().sum() if norms else torch.zeros(())).float().reshape(1)
        if mpu is not None:
            dscomm.all_reduce(total, op=dscomm.ReduceOp.SUM, group=mpu.get_model_parallel_group())
        total = total.pow(1.0 / norm_type)
    data_group = parallel_groups.get_data_parallel_group()
    total = total / float(dscomm.get_world_size(group=data_group))
    dscomm.all_reduce(total, group=data_group)
    total = total.to(params[0].device)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for param in params:
        param.grad.data.mul_(coef)
    return total


class CheckOverflow:
    """Whether any rank's gradients hold an inf or a NaN (DeepSpeed's fp16 overflow check), reduced over the ranks
    that must agree: the largest expert group when expert parameters are present, `mpu`'s model group, or the
    world (`zero_reduce_scatter`, or a `deepspeed` engine that leaves gradients unreduced)."""

    def __init__(self, param_groups: Any = None, mpu: Any = None, zero_reduce_scatter: bool = False,
                 deepspeed: Any = None):
        self.mpu = mpu
        self.zero_reduce_scatter = zero_reduce_scatter
        self.deepspeed = deepspeed
        self.params = [p for group in param_groups for p in group] if param_groups else None
        self.has_moe_params = any(is_moe_param(p) for p in self.params or ())

    def check_using_norm(self, norm_group: Iterable[float], reduce_overflow: bool = True) -> bool:
        """An overflow when a norm of `norm_group` is -1 (get_weight_norm's mark) on any rank that must agree."""
        flag = torch.tensor([1.0 if -1 in list(norm_group) else 0.0])
        if self.has_moe_params:
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX, group=parallel_groups._get_max_expert_parallel_group())
        if self.mpu is not None:
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX, group=self.mpu.get_model_parallel_group())
        elif reduce_overflow:
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX)
        return bool(flag[0])

    def check(self, param_groups: Any = None) -> bool:
        """An overflow in the gradients of `param_groups` (default: the groups given at construction)."""
        if param_groups is None:
            if self.params is None:
                raise ValueError("CheckOverflow.check(): no parameters: pass param_groups here or to CheckOverflow()")
            return self.has_overflow(self.params, has_moe_params=self.has_moe_params)
        params = [p for group in param_groups for p in group]
        return self.has_overflow(params, has_moe_params=any(is_moe_param(p) for p in params))

    def has_overflow_serial(self, params: Iterable[Any]) -> bool:
        return any(p.grad is not None and self._has_inf_or_nan(p.grad.data) for p in params)

    def has_overflow(self, params: Iterable[Any], has_moe_params: bool | None = None) -> bool:
        if has_moe_params is None:
            has_moe_params = self.has_moe_params
        flag = torch.tensor([1.0 if self.has_overflow_serial(params) else 0.0])
        if has_moe_params:
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX, group=parallel_groups._get_max_expert_parallel_group())
        if self.zero_reduce_scatter:
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX)
        elif self.mpu is not None:
            if self._gradients_left_unreduced():
                dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX, group=self.mpu.get_data_parallel_group())
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX, group=self.mpu.get_model_parallel_group())
        elif self._gradients_left_unreduced():
            dscomm.all_reduce(flag, op=dscomm.ReduceOp.MAX)
        return bool(flag[0])

    def _gradients_left_unreduced(self) -> bool:
        engine = self.deepspeed
        if engine is None:
            return False
        name = ("pipeline_enable_backward_allreduce" if hasattr(engine, "pipeline_enable_backward_allreduce")
                else "enable_backward_allreduce")
        return getattr(engine, name, True) is False

    @staticmethod
    def _has_inf_or_nan(x: torch.Tensor, i: int | None = None) -> bool:
        return not bool(torch.isfinite(x).all())
