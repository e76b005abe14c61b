"""One parameter's whole fp32 value, gradient or optimizer state, assembled from ZeRO's shards.

DeepSpeed's `safe_get_full_fp32_param` and friends, for code that inspects or edits a parameter by
hand (weight surgery, logging a gradient). The `full` functions are collective over the parameter's group:
call them on every rank of the data-parallel group with the same parameter.

The `local` functions (`safe_get_local_fp32_param`, `safe_get_local_grad`, `safe_get_local_optimizer_state`)
answer this rank's piece of the parameter without communication: the elements of the parameter that fall in
this rank's shard of its group's flat buffer, as a 1-D fp32 tensor in the parameter's flattened order (empty
where the rank holds none of it). Unlike DeepSpeed's ZeRO-3, where every parameter is cut into equal pieces,
dszero cuts the group's buffer, so a piece's length depends on where the parameter lies in it:
`local_range(param)` says which elements are this rank's.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from .errors import ZeroError
from .layout import Slot
from .wire import whole_slot

if TYPE_CHECKING:
    from .optimizer import ZeroOptimizer

_OWNER = "_dszero_owner"  # on each parameter: a weak reference to its ZeroOptimizer


def register(zero: ZeroOptimizer) -> None:
    """Let each parameter of `zero`'s groups find its optimizer, group and slot."""
    owner = weakref.ref(zero)
    for index, group in enumerate(zero.groups):
        for param, slot in zip(group.params, group.layout.slots):
            setattr(param, _OWNER, (owner, index, slot))


def _locate(param: torch.Tensor) -> tuple[ZeroOptimizer, Any, Slot]:
    found = getattr(param, _OWNER, None)
    zero = found[0]() if found is not None else None
    if zero is None:
        raise ZeroError(f"parameter of shape {tuple(param.shape)} is not trained by a ZeroOptimizer (not given to "
                        f"one, frozen, or its optimizer is gone)")
    return zero, zero.groups[found[1]], found[2]


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor:
    """The parameter's whole master (fp32) value."""
    zero, group, slot = _locate(param)
    with zero.stepper.resident():
        return whole_slot(group.master.float(), group.layout, slot, group.group)


def safe_set_full_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    """Replace the parameter's master value (and so its model weights) on every rank."""
    zero, group, slot = _locate(param)
    if tuple(value.shape) != tuple(slot.shape):
        raise ZeroError(f"safe_set_full_fp32_param({slot.name}): value has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(slot.shape)}")
    lo, hi = group.layout.shard_range(group.shard_rank)
    start, end = max(lo, slot.offset), min(hi, slot.end)
    with zero.stepper.resident(write_back=True):
        if start < end:
            flat = value.detach().reshape(-1).to(device=group.master.device, dtype=group.master.dtype)
            group.master[start - lo:end - lo].copy_(flat[start - slot.offset:end - slot.offset])
        zero._share_updated_weights()


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor:
    """The parameter's gradient as the next step() will apply it: reduced over the data-parallel ranks
    (averaged as configured) and unscaled from the fp16 loss scale, in fp32. Call it after the step's
    backward passes and before step()."""
    zero, group, slot = _locate(param)
    zero.finish_backward()
    index = zero.groups.index(group)
    return zero.reducer.full_grad(index, slot, zero.gradient_unscale)


def safe_get_full_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor:
    """The parameter's whole optimizer state `optim_state_key` ("exp_avg", "exp_avg_sq", ...)."""
    zero, group, slot = _locate(param)
    with zero.stepper.resident():
        state = zero.optimizer.state.get(group.master_param, {})
        if optim_state_key not in state or not torch.is_tensor(state[optim_state_key]):
            raise ZeroError(f"{slot.name} has no optimizer state {optim_state_key!r}; it has {sorted(state)} (the "
                            f"optimizer creates its state at the first step)")
        return whole_slot(state[optim_state_key].float(), group.layout, slot, group.group)


def local_range(param: torch.Tensor) -> tuple[int, int]:
    """[start, end) of this rank's elements of `param` (its flattened order); start == end when it holds none."""
    _, group, slot = _locate(param)
    lo, hi = group.layout.shard_range(group.shard_rank)
    start, end = max(lo, slot.offset), min(hi, slot.end)
    return (start - slot.offset, end - slot.offset) if start < end else (0, 0)


def _shard_slice(param: torch.Tensor) -> tuple[ZeroOptimizer, Any, Slot, slice]:
    zero, group, slot = _locate(param)
    first, last = local_range(param)
    lo = group.layout.shard_range(group.shard_rank)[0]
    return zero, group, slot, slice(slot.offset + first - lo, slot.offset + last - lo)


def safe_get_local_fp32_param(param: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the parameter's master (fp32) value (see the module docstring); no communication."""
    zero, group, _, piece = _shard_slice(param)
    with zero.stepper.resident():
        return group.master[piece].float().clone()


def safe_get_local_grad(param: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the gradient the next step() applies (reduced, averaged, unscaled), fp32. No
    communication at stages 2 and 3; at stages 0 and 1 the gradients are reduced only at the step, so it
    reduces this parameter's gradient (collective, as safe_get_full_grad). Call it after the backward passes."""
    zero, group, slot, piece = _shard_slice(param)
    zero.finish_backward()
    index = zero.groups.index(group)
    shard = zero.reducer.grad_shard(index)
    if shard is None:
        first, last = local_range(param)
        return zero.reducer.full_grad(index, slot, zero.gradient_unscale).reshape(-1)[first:last].clone()
    return shard[piece].float() / zero.gradient_unscale


def safe_get_local_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor:
    """This rank's piece of the parameter's optimizer state `optim_state_key`, fp32; no communication."""
    zero, group, slot, piece = _shard_slice(param)
    with zero.stepper.resident():
        state = zero.optimizer.state.get(group.master_param, {})
        if optim_state_key not in state or not torch.is_tensor(state[optim_state_key]):
            raise ZeroError(f"{slot.name} has no optimizer state {optim_state_key!r}; it has {sorted(state)} (the "
                            f"optimizer creates its state at the first step)")
        return state[optim_state_key][piece].float().clone()


def safe_set_full_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    """Make `value` the gradient the next step() applies to the parameter (as safe_get_full_grad would answer
    it). Call it on every rank with the same value, after the backward passes and before step(); without
    communication. At stages 2 and 3 each rank keeps its piece of the reduced gradient; at stages 0 and 1, which
    reduce at the step itself, each rank's own gradient becomes its share of that reduction."""
    zero, group, slot, piece = _shard_slice(param)
    if tuple(value.shape) != tuple(slot.shape):
        raise ZeroError(f"safe_set_full_grad({slot.name}): value has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(slot.shape)}")
    zero.finish_backward()
    index = zero.groups.index(group)
    shard = zero.reducer.grad_shard(index)
    if shard is None:
        whole = value.detach().reshape(-1).to(device=group.model_flat.device, dtype=torch.float32)
        zero.reducer.set_reduced(index, param, slot, whole * zero.gradient_unscale)
        return
    first, last = local_range(param)
    flat = value.detach().reshape(-1)[first:last].to(device=shard.device, dtype=torch.float32)
    shard[piece].copy_(flat * zero.gradient_unscale)


def _local_value(name: str, slot: Slot, value: torch.Tensor, first: int, last: int) -> torch.Tensor:
    if value.numel() != last - first:
        raise ZeroError(f"{name}({slot.name}): this rank holds {last - first} of the parameter's elements "
                        f"[{first}, {last}) (dszero.fragments.local_range), the value has {value.numel()}")
    return value.detach().reshape(-1)


def safe_set_local_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    """Replace this rank's piece of the parameter's master value (`value`: as many elements as
    safe_get_local_fp32_param answers). The model weights follow: call it on every rank of the group (each with
    its own piece, possibly empty), as the updated shards are shared with the other ranks."""
    zero, group, slot, piece = _shard_slice(param)
    first, last = local_range(param)
    flat = _local_value("safe_set_local_fp32_param", slot, value, first, last)
    with zero.stepper.resident(write_back=True):
        group.master[piece].copy_(flat.to(device=group.master.device, dtype=group.master.dtype))
        zero._share_updated_weights()


def safe_set_local_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    """Make `value` this rank's piece of the gradient the next step() applies (as safe_get_local_grad answers
    it); no communication. Stages 2 and 3 only (below them the gradients are reduced at the step)."""
    zero, group, slot, piece = _shard_slice(param)
    first, last = local_range(param)
    flat = _local_value("safe_set_local_grad", slot, value, first, last)
    zero.finish_backward()
    shard = zero.reducer.grad_shard(zero.groups.index(group))
    if shard is None:
        raise ZeroError(f"safe_set_local_grad({slot.name}): at ZeRO stage {zero.stage} gradients are reduced only "
                        f"at the step, from each rank's own; setting the reduced gradient needs stage 2 or 3")
    shard[piece].copy_(flat.to(device=shard.device, dtype=torch.float32) * zero.gradient_unscale)


def _state_tensor(zero: ZeroOptimizer, group: Any, slot: Slot, key: str) -> torch.Tensor:
    state = zero.optimizer.state.get(group.master_param, {})
    if key not in state or not torch.is_tensor(state[key]):
        raise ZeroError(f"{slot.name} has no optimizer state {key!r}; it has {sorted(state)} (the optimizer creates "
                        f"its state at the first step)")
    return state[key]


def safe_set_local_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    """Replace this rank's piece of the parameter's optimizer state `optim_state_key`; no communication."""
    zero, group, slot, piece = _shard_slice(param)
    first, last = local_range(param)
    flat = _local_value("safe_set_local_optimizer_state", slot, value, first, last)
    with zero.stepper.resident(write_back=True):
        target = _state_tensor(zero, group, slot, optim_state_key)
        target[piece].copy_(flat.to(device=target.device, dtype=target.dtype))


def safe_set_full_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    """Replace the parameter's whole optimizer state `optim_state_key`: call it on every rank with the same
    value; each rank keeps its piece, without communication."""
    zero, group, slot, piece = _shard_slice(param)
    if tuple(value.shape) != tuple(slot.shape):
        raise ZeroError(f"safe_set_full_optimizer_state({slot.name}): value has shape {tuple(value.shape)}, the "
                        f"parameter {tuple(slot.shape)}")
    first, last = local_range(param)
    with zero.stepper.resident(write_back=True):
        target = _state_tensor(zero, group, slot, optim_state_key)
        flat = value.detach().reshape(-1)[first:last]
        target[piece].copy_(flat.to(device=target.device, dtype=target.dtype))


def safe_update_full_grad_vectorized(param_list: list[torch.Tensor], update_func: Any) -> None:
    """Replace each parameter's gradient by `update_func(its full gradient, param)`, as safe_get_full_grad
    answers it and safe_set_full_grad sets it: collective, so call it on every rank with the same parameters (and
    an update that gives every rank the same value). Stages 2 and 3, as safe_set_full_grad."""
    for param in param_list:
        old = safe_get_full_grad(param)
        new = update_func(old, param)
        if not torch.is_tensor(new):
            raise ZeroError(f"safe_update_full_grad_vectorized: update_func returned {type(new).__name__} for a "
                            f"parameter of shape {tuple(param.shape) if param.numel() else 'partitioned'}; it must "
                            f"return the new gradient as a tensor")
        safe_set_full_grad(param, new)
