"""dsmoe.autoep.apply: find a Hugging Face model's MoE blocks from the `expert_parallel` config, check
them against the reference's constraints, and swap each for an AutoEPLayer holding this rank's
slice of its experts.

Preset choice: `preset_model` when given; else a `moe_layer_pattern` takes the custom path (the
model type's preset, if there is one, fills in every key the config leaves null); else the preset
of `model.config.model_type`; else every preset looks for blocks it recognises, and two presets
claiming one module is an error. Every refusal names the config key to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dsconfig import ExpertParallelConfig

from ..errors import MoEError
from ..experts import mark_expert_parameters
from .grouped import choose_backend
from .layer import AutoEPLayer, BlockNames, LocalExperts
from .presets import PRESETS, Preset, preset_for_model_type
from .routing import RoutingSpec

KEY = "expert_parallel"


@dataclass(frozen=True)
class Plan:
    """What apply() resolved from the preset, the config and the model's config."""

    preset: str  # the preset's name, or "custom"
    pattern: str
    names: BlockNames
    num_experts_attr: str | None
    top_k: int | None  # explicit; else read through top_k_attr
    top_k_attr: str | None
    score_func: str
    route_norm: bool
    scale: float
    group_score: str | None
    num_groups: int | None
    limited_groups: int | None
    group_mask_value: float
    score_apply: str
    combine_impl: str
    require_shared: bool  # has_shared_experts true, or shared_experts_pattern named: the child must exist
    require_shared_gate: bool  # shared_experts_gate_pattern named


def apply(model: nn.Module, config: ExpertParallelConfig, ep_group: Any = None, *, model_config: Any = None,
          backend: str | None = None, replicated_tokens: bool = False, require_blocks: bool = True) -> list[str]:
    """Replace every MoE block of `model` (in place) by an expert-parallel AutoEPLayer over `ep_group`
    (autoep_size ranks; None at autoep_size 1). Returns the replaced modules' names. `backend` forces
    the expert compute ("loop", "grouped_mm", "triton"); by default it follows use_grouped_mm.
    `replicated_tokens`: every rank of ep_group holds the same tokens (AutoTP's tensor group), so no token
    is exchanged: each rank computes its experts' share and the shares are summed (replicated.py).
    `require_blocks=False`: a model without MoE blocks is left as it is (a pipeline stage whose layers hold
    none; the caller checks that some stage does)."""
    if not config.enabled:
        return []
    _check_reserved(config)
    hf_config = model_config if model_config is not None else getattr(model, "config", None)
    plan = _plan(model, config, hf_config)
    blocks = _find_blocks(model, plan)
    if not blocks and not require_blocks:
        return []
    if not blocks:
        raise MoEError(f"{KEY}: no module matches moe_layer_pattern {plan.pattern!r} with children "
                       f"{plan.names.router!r} (router_pattern) and {plan.names.experts!r} (expert_pattern) "
                       f"(preset {plan.preset!r}); set {KEY}.preset_model or {KEY}.moe_layer_pattern")
    _check_combine(config, plan, model)
    checked = [(name, block, _check_block(block, name, plan, hf_config, config.autoep_size)) for name, block in blocks]
    ep_size, ep_rank = _ep_layout(config, ep_group)
    replaced = []
    for name, block, (spec, names, hidden) in checked:
        local, _ = _local_experts(getattr(block, names.experts), names, spec.num_experts, hidden, ep_size, ep_rank,
                                  f"MoE block {name!r}")
        w1 = getattr(local, names.w1)
        dims = [hidden, *w1.shape[1:], *getattr(local, names.w2).shape[1:]]
        chosen = choose_backend(config.use_grouped_mm, config.disable_triton_grouped_mm, w1.device, w1.dtype, dims,
                                backend)
        mark_expert_parameters(local, f"ep_size_{ep_size}")  # dsmoe's tags: param groups, ZeRO keys, checkpoints
        layer = AutoEPLayer(block, names, spec, local, ep_group, ep_size, plan.score_apply, plan.combine_impl, chosen,
                            replicated_tokens=replicated_tokens)
        layer.layer_name = name
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        replaced.append(name)
    return replaced


def autoep_layers(module: nn.Module) -> list[tuple[str, AutoEPLayer]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, AutoEPLayer)]


def placed_modules(model: nn.Module, config: ExpertParallelConfig, *, model_config: Any = None) -> list[str]:
    """The modules apply() would place (each MoE block's experts and router), by name, without changing the
    model: what a tensor-parallel plan keeps whole when AutoEP runs beside it."""
    if not config.enabled:
        return []
    plan = _plan(model, config, model_config if model_config is not None else getattr(model, "config", None))
    return [f"{name}.{child}" for name, _ in _find_blocks(model, plan) for child in (plan.names.experts,
                                                                                   plan.names.router)]


# ------------------------------------------------------------------------------------------ plan
def _check_reserved(config: ExpertParallelConfig) -> None:
    if config.expert_tensor_parallel_size != 1:
        raise MoEError(f"{KEY}.expert_tensor_parallel_size is {config.expert_tensor_parallel_size}; AutoEP accepts "
                       f"only 1")
    if config.load_balance_coeff is not None:
        raise MoEError(f"{KEY}.load_balance_coeff must be null (auxiliary-loss-free balancing is not supported)")
    if config.async_split_plan and config.autoep_size > 1:  # the reference: no effect at autoep_size 1
        raise MoEError(f"{KEY}.async_split_plan: the CUDA side-stream copy of the split sizes is not implemented "
                       f"(dsmoe reads every split size in one host sync per layer); set it to false")


def _ep_layout(config: ExpertParallelConfig, ep_group: Any) -> tuple[int, int]:
    if ep_group is None:
        if config.autoep_size != 1:
            raise MoEError(f"{KEY}.autoep_size is {config.autoep_size} but no expert-parallel group was given")
        return 1, 0
    size = dist.get_world_size(ep_group)
    if size != config.autoep_size:
        raise MoEError(f"{KEY}.autoep_size is {config.autoep_size} but the expert-parallel group has {size} ranks")
    return size, dist.get_rank(ep_group)


def _choose_preset(model: nn.Module, config: ExpertParallelConfig, hf_config: Any) -> tuple[Preset | None, str]:
    model_type = getattr(hf_config, "model_type", None)
    if config.preset_model is not None:
        return PRESETS[config.preset_model], config.preset_model
    if config.moe_layer_pattern is not None:
        return preset_for_model_type(model_type), "custom"
    preset = preset_for_model_type(model_type)
    if preset is not None:
        return preset, preset.name
    claims: dict[str, list[str]] = {}
    for candidate in PRESETS.values():
        for name, _ in _find_blocks(model, _preset_plan(candidate, config, hf_config), hf_config, strict=True):
            claims.setdefault(name, []).append(candidate.name)
    contested = {name: found for name, found in claims.items() if len(found) > 1}
    if contested:
        name, found = next(iter(contested.items()))
        raise MoEError(f"{KEY}.preset_model: model type {model_type!r} has no preset and presets {found} all claim "
                       f"module {name!r}; name one in {KEY}.preset_model")
    found = sorted({p for names in claims.values() for p in names})
    if not found:
        raise MoEError(f"{KEY}.preset_model: model type {model_type!r} has no preset and no preset recognises its "
                       f"MoE blocks; set {KEY}.preset_model (one of {', '.join(PRESETS)}) or a custom "
                       f"{KEY}.moe_layer_pattern with router_pattern and expert_pattern")
    if len(found) > 1:
        raise MoEError(f"{KEY}.preset_model: presets {found} each recognise some of the model's blocks; name one")
    return PRESETS[found[0]], found[0]


def _plan(model: nn.Module, config: ExpertParallelConfig, hf_config: Any) -> Plan:
    preset, label = _choose_preset(model, config, hf_config)
    plan = _preset_plan(preset, config, hf_config, label)
    if plan.names.router is None or plan.names.experts is None:
        missing = "router_pattern" if plan.names.router is None else "expert_pattern"
        raise MoEError(f"{KEY}.{missing}: a custom moe_layer_pattern without a preset needs it")
    return plan


def _preset_plan(preset: Preset | None, config: ExpertParallelConfig, hf_config: Any, label: str | None = None
                 ) -> Plan:
    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    p = preset
    w3 = (p.w3 if p is not None else None) if config.expert_w3_from_preset else config.expert_w3
    has_shared = config.has_shared_experts
    shared = pick(config.shared_experts_pattern, p.shared_experts if p is not None else None)
    shared_gate = pick(config.shared_experts_gate_pattern, p.shared_experts_gate if p is not None else None)
    if has_shared is False:
        shared = shared_gate = None
    names = BlockNames(router=pick(config.router_pattern, p.router if p else None),
                       experts=pick(config.expert_pattern, p.experts if p else None),
                       w1=pick(config.expert_w1, p.w1 if p else "gate_up_proj"),
                       w2=pick(config.expert_w2, p.w2 if p else "down_proj"), w3=w3,
                       shared_experts=shared, shared_experts_gate=shared_gate,
                       correction_bias=p.correction_bias if p else None)
    score_func = config.score_func
    if score_func == "auto":
        score_func = getattr(hf_config, "scoring_func", None) or (p.score_func if p else "softmax")
    if score_func not in ("softmax", "sigmoid"):
        raise MoEError(f"{KEY}.score_func: model.config.scoring_func is {score_func!r}; set softmax or sigmoid")
    route_norm = config.route_norm
    if route_norm is None:
        norm_attr = p.norm_attr if p else "norm_topk_prob"
        from_config = getattr(hf_config, norm_attr, None) if norm_attr else None
        route_norm = bool(from_config) if from_config is not None else (p.route_norm if p else False)
    scaling = config.routed_scaling_factor
    if scaling == "auto":
        scaling = getattr(hf_config, p.scaling_attr if p and p.scaling_attr else "routed_scaling_factor", None) or 1.0
    groups, limited = config.num_expert_groups, config.num_limited_groups
    grouped_here = p is not None and p.group_score is not None and (
        p.groups_method is None or getattr(hf_config, "topk_method", None) == p.groups_method)
    if groups is None and grouped_here:
        groups = getattr(hf_config, p.groups_attr, None)
    if limited is None and groups is not None and grouped_here:
        limited = getattr(hf_config, p.limited_groups_attr, None)
    score_apply = "post" if config.score_apply == "auto" else config.score_apply
    combine = "weighted_sum" if config.combine_impl == "auto" else config.combine_impl
    return Plan(preset=label or (p.name if p else "custom"), pattern=pick(config.moe_layer_pattern,
                p.moe_layer_pattern if p else None), names=names,
                num_experts_attr=pick(config.num_experts_attr, p.num_experts_attr if p else None),
                top_k=None if config.top_k == "auto" else int(config.top_k),
                top_k_attr=pick(config.top_k_attr, p.top_k_attr if p else None), score_func=score_func,
                route_norm=route_norm, scale=float(config.route_scale) * float(scaling),
                group_score=(p.group_score if p and p.group_score else "max"), num_groups=groups,
                limited_groups=limited, group_mask_value=p.group_mask_value if p else float("-inf"),
                score_apply=score_apply, combine_impl=combine,
                require_shared=bool(has_shared) or (has_shared is None and config.shared_experts_pattern is not None),
                require_shared_gate=has_shared is not False and config.shared_experts_gate_pattern is not None)


def _find_blocks(model: nn.Module, plan: Plan, hf_config: Any = None, strict: bool = False) -> list[tuple[str, nn.Module]]:
    """Modules whose name fully matches the pattern and that have the router and experts children
    (strict, for telling presets apart: also the preset's expert weights and number-of-experts attribute)."""
    if plan.pattern is None or plan.names.router is None or plan.names.experts is None:
        return []
    pattern = re.compile(plan.pattern)
    found = []
    for name, module in model.named_modules():
        if isinstance(module, AutoEPLayer) or not pattern.fullmatch(name):
            continue
        router, experts = getattr(module, plan.names.router, None), getattr(module, plan.names.experts, None)
        if not isinstance(router, nn.Module) or not isinstance(experts, nn.Module):
            continue
        if strict and not _recognises(module, experts, router, plan, hf_config):
            continue
        found.append((name, module))
    return found


def _recognises(block: nn.Module, experts: nn.Module, router: nn.Module, plan: Plan, hf_config: Any) -> bool:
    names = plan.names
    weights = [names.w1, names.w2] + ([names.w3] if names.w3 else [])
    if not all(isinstance(getattr(experts, w, None), torch.Tensor) for w in weights):
        return False
    if not all(hasattr(hf_config, a) for a in (plan.num_experts_attr, plan.top_k_attr) if a is not None):
        return False
    if (names.correction_bias is not None) != hasattr(router, "e_score_correction_bias"):
        return False
    has_shared = any(hasattr(block, s) for s in ("shared_expert", "shared_experts"))
    return names.shared_experts is not None or not has_shared


# ------------------------------------------------------------------------------------------ checks and swap
def _check_combine(config: ExpertParallelConfig, plan: Plan, model: nn.Module) -> None:
    if plan.combine_impl != "fused_weighted_sum":
        return
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cuda" or param.dtype not in (torch.bfloat16, torch.float16):
        raise MoEError(f"{KEY}.combine_impl: \"fused_weighted_sum\" needs CUDA, Triton and bfloat16/float16 "
                       f"activations; use \"weighted_sum\" (or \"auto\")")
    if plan.score_apply != "post":
        raise MoEError(f"{KEY}.combine_impl: \"fused_weighted_sum\" needs score_apply \"post\"")
    raise MoEError(f"{KEY}.combine_impl: \"fused_weighted_sum\" is not implemented by dsmoe; use \"weighted_sum\"")


def _config_int(hf_config: Any, attr: str | None, key: str, where: str) -> int:
    value = getattr(hf_config, attr, None) if attr else None
    if not isinstance(value, int) or isinstance(value, bool):
        raise MoEError(f"{KEY}.{key}: model.config.{attr} is {value!r}, not an int ({where}); set {KEY}.{key} to "
                       f"the config attribute that holds it")
    return value


def _check_block(block: nn.Module, name: str, plan: Plan, hf_config: Any, ep_size: int
                 ) -> tuple[RoutingSpec, BlockNames, int]:
    """The block's routing and names, after every check of the reference's constraints."""
    names, where = plan.names, f"MoE block {name!r}"
    router, experts = getattr(block, names.router), getattr(block, names.experts)
    router_weight = getattr(router, "weight", None)
    if not isinstance(router_weight, torch.Tensor) or router_weight.dim() != 2:
        raise MoEError(f"{KEY}.router_pattern: {where}.{names.router} has no 2-D weight [experts, hidden]")
    if plan.num_experts_attr is not None:
        num_experts = _config_int(hf_config, plan.num_experts_attr, "num_experts_attr", where)
    else:
        num_experts = router_weight.shape[0]
    hidden = router_weight.shape[1]
    if router_weight.shape[0] != num_experts:
        raise MoEError(f"{KEY}.num_experts_attr: {where}'s router weight has shape {tuple(router_weight.shape)} but "
                       f"model.config.{plan.num_experts_attr} is {num_experts}")
    top_k = plan.top_k if plan.top_k is not None else _config_int(hf_config, plan.top_k_attr, "top_k_attr", where)
    if not 1 <= top_k <= num_experts:
        raise MoEError(f"{KEY}.top_k: {top_k} experts per token but {where} has {num_experts} experts")
    if num_experts % ep_size:
        valid = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise MoEError(f"{KEY}.autoep_size: {ep_size} does not divide the {num_experts} experts of {where}; "
                       f"valid: {', '.join(map(str, valid))}")
    _check_groups(plan, num_experts, top_k, where)
    if plan.require_shared and (names.shared_experts is None or not hasattr(block, names.shared_experts)):
        raise MoEError(f"{KEY}.shared_experts_pattern: has_shared_experts is true but {where} has no child "
                       f"{names.shared_experts!r}")
    shared = names.shared_experts if names.shared_experts and hasattr(block, names.shared_experts) else None
    if plan.require_shared_gate and not hasattr(block, names.shared_experts_gate):
        raise MoEError(f"{KEY}.shared_experts_gate_pattern: {where} has no child {names.shared_experts_gate!r}")
    shared_gate = names.shared_experts_gate if shared and hasattr(block, names.shared_experts_gate or "") else None
    bias = names.correction_bias if names.correction_bias and hasattr(router, names.correction_bias) else None
    names = BlockNames(names.router, names.experts, names.w1, names.w2, names.w3, shared, shared_gate, bias)
    _local_experts(experts, names, num_experts, hidden, 1, 0, where, check_only=True)
    spec = RoutingSpec(num_experts, top_k, plan.score_func, plan.route_norm, plan.scale, plan.num_groups,
                       plan.limited_groups, plan.group_score, plan.group_mask_value)
    return spec, names, hidden


def _check_groups(plan: Plan, num_experts: int, top_k: int, where: str) -> None:
    groups, limited = plan.num_groups, plan.limited_groups
    if groups is None:
        if limited is not None:
            raise MoEError(f"{KEY}.num_limited_groups needs {KEY}.num_expert_groups")
        return
    if num_experts % groups:
        raise MoEError(f"{KEY}.num_expert_groups: {groups} groups do not divide the {num_experts} experts of {where}")
    if limited is None:
        raise MoEError(f"{KEY}.num_limited_groups: {KEY}.num_expert_groups is {groups}; set how many groups each "
                       f"token may use")
    if limited > groups:
        raise MoEError(f"{KEY}.num_limited_groups: {limited} must be <= {KEY}.num_expert_groups ({groups})")
    per_group = num_experts // groups
    if top_k > limited * per_group:
        raise MoEError(f"{KEY}.num_limited_groups: {limited} group(s) of {per_group} experts hold fewer than top_k "
                       f"{top_k} experts ({where})")
    if plan.group_score == "top2_sum" and per_group < 2 and limited < groups:
        raise MoEError(f"{KEY}.num_expert_groups: the group score sums each group's top 2 experts, but {where}'s "
                       f"{groups} groups have {per_group} expert each")


def _local_experts(experts: nn.Module, names: BlockNames, num_experts: int, hidden: int, ep_size: int,
                   ep_rank: int, where: str, check_only: bool = False) -> tuple[LocalExperts | None, bool]:
    keys = {"expert_w1": names.w1, "expert_w2": names.w2}
    if names.w3 is not None:
        keys["expert_w3"] = names.w3
    weights = {}
    for key, attr in keys.items():
        tensor = getattr(experts, attr, None)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3 or tensor.shape[0] != num_experts:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
            raise MoEError(f"{KEY}.{key}: {where}.{names.experts}.{attr} must be a 3-D tensor [{num_experts} experts, "
                           f"., .]; found {shape if shape is not None else 'no such tensor'}")
        weights[attr] = tensor
    in_out = _layout(weights, names, hidden, where)
    if check_only:
        return None, in_out
    per_rank = num_experts // ep_size
    first = ep_rank * per_rank
    local = {}
    for attr, tensor in weights.items():
        if ep_size == 1 and isinstance(tensor, nn.Parameter):
            local[attr] = tensor
        else:
            local[attr] = nn.Parameter(tensor.detach()[first:first + per_rank].clone(),
                                       requires_grad=tensor.requires_grad)
    act = getattr(experts, "act_fn", None) or F.silu
    return LocalExperts(local, first, num_experts, in_out, act), in_out


def _layout(weights: dict[str, torch.Tensor], names: BlockNames, hidden: int, where: str) -> bool:
    """True for [E, in, out] weights, False for [E, out, in] (F.linear's); from the down projection,
    which maps ffn -> hidden, checked against the gate (fused gate+up: twice the ffn)."""
    down = weights[names.w2]
    ups = 2 if names.w3 is None else 1
    for in_out in (False, True):
        ffn = down.shape[1] if in_out else down.shape[2]
        expected_down = (ffn, hidden) if in_out else (hidden, ffn)
        expected_gate = (hidden, ups * ffn) if in_out else (ups * ffn, hidden)
        if tuple(down.shape[1:]) == expected_down and tuple(weights[names.w1].shape[1:]) == expected_gate and (
                names.w3 is None or tuple(weights[names.w3].shape[1:]) == expected_gate):
            return in_out
    shapes = {attr: tuple(t.shape) for attr, t in weights.items()}
    fused = "fused gate+up (expert_w3 null)" if names.w3 is None else "separate gate and up"
    raise MoEError(f"{KEY}.expert_w1: {where}'s expert weights {shapes} fit neither [E, out, in] nor [E, in, out] "
                   f"for hidden size {hidden} with {fused}; check expert_w1/expert_w2/expert_w3")
