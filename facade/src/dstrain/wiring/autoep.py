"""AutoEP in compose() step 2: with `expert_parallel.enabled`, swap the Hugging Face MoE blocks for
dsmoe.autoep layers before the optimizer is built, on the run's expert groups.

The expert-parallel group is `autoep_size` consecutive data-parallel ranks (dscomm's expert groups,
as dsmoe layers use); the ranks holding the same experts form the expert-data group, over which ZeRO
partitions and reduces the experts (wiring/dsmoe.py: expert_param_group_keys gives their param group
"process_group" and "gradient_average_over" = the data-parallel size, so an expert's gradient has
the same scale at every autoep_size). Checkpoints save them one file per global expert and load them at
another autoep_size (checkpoint/experts.py); save_16bit_model gathers them to the original model's
tensors (whole_state_dict).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import dscomm
from dsconfig import DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError
from .across_stages import across_stages, several_stages
from .optional_libs import LazyLibrary, imported

# dsmoe is optional: AutoEP layers exist only once dsmoe is imported (wiring/dsmoe.py guards its callers).
dsmoe = LazyLibrary("dsmoe", "AutoEP (expert_parallel.enabled)")
autoep = LazyLibrary("dsmoe.autoep", "AutoEP (expert_parallel.enabled)")


def apply_autoep(composed: Any, config: DeepSpeedConfig, groups: Any,
                 expert_groups: Callable[[Any, int], tuple[Any, Any]]) -> Any:
    """Swap the MoE blocks (no-op unless expert_parallel.enabled); the optimizer's parameters become
    DeepSpeed's MoE groups. `expert_groups(groups, ep_size)` -> (expert group, expert-data group)."""
    ep = config.expert_parallel
    if not ep.enabled:
        return composed
    over_tensor = experts_over_tensor_ranks(config, groups)
    if over_tensor:  # the tensor group holds the same tokens: each rank a share of the experts, none exchanged
        ep_group, ep_data_group = groups.tensor, groups.data
    else:
        data = groups.size("data") if groups is not None else dscomm.groups.get_data_parallel_world_size()
        if data % ep.autoep_size:
            valid = sorted({d for d in range(1, data + 1) if data % d == 0} | {tensor_size(groups)} - {1})
            raise UnsupportedFeatureError([Problem(
                "expert_parallel.autoep_size", f"must divide the data-parallel size {data}"
                                               f"{' or equal tensor_parallel.autotp_size' if tensor_size(groups) > 1 else ''}"
                                               f"; valid: {valid or [1]}", ep.autoep_size)])
        ep_group, ep_data_group = expert_groups(groups, ep.autoep_size)
    model = composed.model
    before = dict(model.named_parameters())
    pipeline = several_stages(model, groups)
    replaced = on_every_stage(lambda: autoep.apply(
        model, ep, ep_group if ep.autoep_size > 1 else None, model_config=hf_config(model),
        replicated_tokens=over_tensor, require_blocks=not pipeline), model, groups)
    if pipeline and not sum(across_stages(len(replaced), model, groups)):
        raise dsmoe.MoEError("expert_parallel: no MoE block in any stage of the pipeline matches the preset's or "
                             "moe_layer_pattern's module names (a pipeline names its layers by index: '1.mlp'); set "
                             "expert_parallel.moe_layer_pattern")
    for _, layer in autoep.autoep_layers(model):
        layer.expert_data_group = ep_data_group
    after = dict(model.named_parameters())
    swapped = {id(old): (weakref.ref(old), after[name]) for name, old in before.items()
               if name in after and after[name] is not old}
    _SWAPPED[model] = swapped
    parameters = _renewed(composed.model_parameters, swapped, model)
    split = [group for group in dsmoe.configure_moe_param_groups(parameters) if group["params"]]
    replicas = expert_norm_replicas(config, groups)
    for group in split:  # the tensor step counted the whole experts as replicated; placed, they may not be
        if dsmoe.is_moe_param_group(group) and tensor_size(groups) > 1:
            group["norm_replicas"] = replicas
    return dataclasses.replace(composed, model_parameters=split)


def hf_config(model: torch.nn.Module) -> Any:
    """The Hugging Face config AutoEP reads the expert count and top-k from: the model's, or for a model
    built of Hugging Face layers without one of its own (a PipelineModule), the first layer's."""
    config = getattr(model, "config", None)
    if config is not None:
        return config
    return next((m.config for m in model.modules() if hasattr(getattr(m, "config", None), "model_type")), None)


def on_every_stage(action: Callable[[], Any], model: torch.nn.Module, groups: Any) -> Any:
    """action() on this rank; when it raised MoEError on any stage of a pipeline, the same error on every
    rank (a stage that went on would wait forever in the next collective for one that stopped)."""
    try:
        result, failure = action(), None
    except dsmoe.MoEError as exc:
        result, failure = None, str(exc)
    failures = [f for f in across_stages(failure, model, groups) if f]
    if failures:
        raise dsmoe.MoEError(failures[0])
    return result


def tensor_size(groups: Any) -> int:
    return groups.size("tensor") if groups is not None else 1


def experts_over_tensor_ranks(config: DeepSpeedConfig, groups: Any) -> bool:
    """Whether AutoEP beside AutoTP splits the experts over the tensor-parallel group (autoep_size equal to
    autotp_size), rather than over data-parallel ranks (autoep_size dividing the data-parallel size, each
    tensor rank holding the same experts); see dsmoe's README for the group arithmetic."""
    tensor = tensor_size(groups)
    return config.expert_parallel.enabled and tensor > 1 and config.expert_parallel.autoep_size == tensor


def expert_norm_replicas(config: DeepSpeedConfig, groups: Any) -> int:
    """How many ranks of the norm group hold each AutoEP expert's gradient besides its ZeRO group: every
    tensor rank when the experts are split over data ranks beside AutoTP, else none."""
    tensor = tensor_size(groups)
    return 1 if tensor == 1 or experts_over_tensor_ranks(config, groups) else tensor


def _renewed(parameters: Any, swapped: dict[int, Any], model: torch.nn.Module) -> Any:
    """The user's parameters (or param groups) with each swapped expert weight replaced by the
    rank's slice that now stands under its name (default: all of the model's parameters)."""
    if parameters is None:
        return list(model.parameters())
    items = list(parameters)
    if items and isinstance(items[0], dict):
        return [{**group, "params": _renew(group["params"], swapped)} for group in items]
    return _renew(items, swapped)


def _renew(params: Any, swapped: dict[int, Any]) -> list[Any]:
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    renewed = []
    for p in params:
        old, new = swapped.get(id(p), (None, None))
        renewed.append(new if old is not None and old() is p else p)
    return renewed


def renew_optimizer_params(optimizer: Any, module: torch.nn.Module) -> None:
    """A client optimizer built before initialize() holds the experts' whole tensors: point it at
    the rank's slices now under the same names (before its first step)."""
    swapped = _SWAPPED.get(module)
    if optimizer is None or not swapped:
        return
    for group in optimizer.param_groups:
        group["params"] = _renew(group["params"], swapped)


# model -> {id(old expert weight): (weak reference to it, its slice)}; weak, so the whole experts are freed
_SWAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------------------------------ weights
def broadcast_autoep_experts(module: torch.nn.Module) -> None:
    """Every rank starts from its expert-data group's first rank's experts."""
    for _, layer in autoep.autoep_layers(module):
        broadcast_experts_from_first(layer.expert_data_group, layer.local_experts.parameters())


def broadcast_experts_from_first(group: Any, params: Any) -> None:
    """Every rank of an expert-data group takes its first rank's copy of `params` (its experts)."""
    if group is None or dist.get_world_size(group) == 1:
        return
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for param in params:
            dscomm.broadcast(param.data, src, group=group, log_name="engine_broadcast_experts")


def whole_state_dict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the AutoEP experts gathered to the original model's [experts, ...] tensors
    (collective over each layer's expert-parallel group: every rank calls it)."""
    if not imported("dsmoe") or not autoep.autoep_layers(module):
        return state
    return autoep.full_expert_state_dict(module, state)
