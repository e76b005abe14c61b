"""Apply a plan to a model in place: cut the parameters, swap Linear layers for parallel ones, and
install what the plan implies (attention head counts per rank, the vocab-parallel loss, the
half-batch overlap). Every rank calls it with the same model; tensor rank 0's weights are the ones cut.

    tp = dstp.parallelize(model, group, tp_overlap_comm=False)   # from the model's own rules
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import dscomm

from .comm import TensorGroup
from .errors import TensorParallelError
from .geometry import ModelGeometry
from .hf_plan import STYLES, hf_pattern, hf_tp_plan
from .layers import ColumnParallelLinear, RowParallelLinear, wrap_region
from .overlap import batch_size, merge_batch, split_batch
from .plan import ParamInfo, TensorParallelPlan, build_plan
from .rules import resolve_specs
from .shard import shard_tensor
from .specs import LayerSpec
from .vocab import VocabParallelCausalLMLoss

_log = logging.getLogger("dstp")
STATE_ATTR = "dstp_state"  # the TensorParallelModel a parallelized model carries
HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_head", "n_heads",
                    "num_key_value_groups_per_rank")


@dataclass(eq=False)
class TensorParallelModel:
    """What parallelize() did to a model: the plan, the group, and the names of the cut parameters."""

    plan: TensorParallelPlan
    tensor_group: TensorGroup
    geometry: ModelGeometry
    overlap_body: str | None = None
    handles: list[Any] = field(default_factory=list)

    @property
    def tp_size(self) -> int:
        return self.plan.tp_size

    @property
    def tp_rank(self) -> int:
        return self.tensor_group.rank

    @property
    def clock(self) -> Any:
        return self.tensor_group.clock


def param_infos(model: nn.Module) -> list[ParamInfo]:
    """Every parameter of `model` (each name of a shared one once, the others as its aliases)."""
    kinds = {}
    for module_name, module in model.named_modules():
        kind = "linear" if isinstance(module, nn.Linear) else "embedding" if isinstance(module, nn.Embedding) \
            else "other"
        for param_name, _ in module.named_parameters(recurse=False):
            kinds[f"{module_name}.{param_name}" if module_name else param_name] = kind
    names_of: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
        shapes[id(param)] = tuple(param.shape)
    infos = []
    for key, names in names_of.items():
        for name in names:
            infos.append(ParamInfo(name, shapes[key], kinds.get(name, "other"),
                                   tuple(n for n in names if n != name)))
    return infos


def plan_for(model: nn.Module, tp_size: int, *, preset_model: str | None = None, partition_config: Any = None,
             vocab_parallel_lm_head: bool = False, params: list[ParamInfo] | None = None,
             keep_whole: Sequence[str] = (), keep_whole_why: str = "kept whole",
             model_level_plan: bool = True) -> TensorParallelPlan:
    """The plan for `model` from the config's keys (see rules.resolve_specs), without changing it. `params`:
    the parameters to plan (default: param_infos(model)); a pipeline stage plans every stage's, so that its
    plan is the whole model's and a rule is checked against every parameter it may match. `keep_whole`:
    module names whose parameters stay whole before any rule applies (what another parallelism places:
    AutoEP's experts and routers), `keep_whole_why` saying so in the plan. `model_level_plan`: false keeps the
    model-level entries of a Hugging Face plan (lm_head colwise_gather_output) out, as the autotp compiler pass,
    which emits no gathered output, needs."""
    params = param_infos(model) if params is None else params
    geometry, model_notes = ModelGeometry.from_config(getattr(model, "config", None)), []
    if model_level_plan:
        geometry, model_notes = _with_model_plan(model, geometry, params, tp_size)
    specs, source, notes = resolve_specs(preset_model, partition_config, geometry)
    if "base_model_tp_plan" in source:  # the model's plan is what splits it (no preset, no partition_config)
        notes = model_notes + notes
    if keep_whole:
        pattern = "(?:" + "|".join(re.escape(name) for name in keep_whole) + r")\..+"
        specs = [LayerSpec(patterns=(pattern,), partition_type="skip", source=keep_whole_why), *specs]
    plan = build_plan(params, specs, tp_size, geometry, source=source,
                      vocab_parallel_lm_head=vocab_parallel_lm_head)
    plan.notes += notes
    return plan


def _with_model_plan(model: nn.Module, geometry: ModelGeometry, params: list[ParamInfo], tp_size: int
                     ) -> tuple[ModelGeometry, list[str]]:
    """`geometry` with the model's whole Hugging Face plan (hf_tp_plan: the config's, plus the model-level
    entries such as "lm_head" that transformers keeps on the model). A model-level entry is used only where it
    can split: one whose style dstp does not apply, or whose weight is tied to another parameter or does not
    divide by `tp_size`, is left out (the module stays whole, as it did without it), with a note."""
    merged = hf_tp_plan(model)
    base = geometry.base_model_tp_plan or {}
    if not merged or merged == base:
        return geometry, []
    kept: dict[str, str] = {}
    notes: list[str] = []
    for path, style in merged.items():
        if path not in base:
            kind = STYLES.get(style.lower(), ("unsupported", {}))[0]
            pattern = re.compile(hf_pattern(path))
            hits = [p for p in params if pattern.match(p.name) and p.name.endswith("weight")]
            dim = 0 if kind == "column" else -1
            why = ("its style is not one dstp applies" if kind == "unsupported" else
                   "it is tied to another parameter" if any(p.aliases for p in hits) else
                   f"it does not divide by autotp_size {tp_size}" if kind in ("column", "row") and any(
                       not p.shape or p.shape[dim] % tp_size for p in hits) else None)
            if why is not None:
                notes.append(f"the model's _tp_plan entry {path!r}: {style!r} is not used ({why}): it stays whole")
                continue
        kept[path] = style
    return dataclasses.replace(geometry, base_model_tp_plan=kept or None), notes


def parallelize(model: nn.Module, group: Any, plan: TensorParallelPlan | None = None, *,
                tp_overlap_comm: bool = False, preset_model: str | None = None, partition_config: Any = None,
                vocab_parallel_lm_head: bool = False) -> TensorParallelModel:
    """Cut `model` over the tensor-parallel process group `group` by `plan` (default: plan_for(...) at the
    group's size). Parameters keep their identity (their data becomes the shard) and are tagged with
    dscomm.TENSOR_PARALLEL_ATTR; untagged ones are replicated over the group. The plan may name parameters
    the model does not hold (a pipeline stage's plan is the whole pipeline's): those are left alone."""
    if getattr(model, STATE_ATTR, None) is not None:
        raise TensorParallelError("the model is already tensor-parallel (parallelize() ran on it before)")
    tensor_group = TensorGroup(group, overlap=tp_overlap_comm)
    if plan is None:
        plan = plan_for(model, tensor_group.size, preset_model=preset_model, partition_config=partition_config,
                        vocab_parallel_lm_head=vocab_parallel_lm_head)
    if plan.tp_size != tensor_group.size:
        raise TensorParallelError(f"the plan is for autotp_size {plan.tp_size} but the tensor group has "
                                  f"{tensor_group.size} ranks")
    geometry = ModelGeometry.from_config(getattr(model, "config", None))
    state = TensorParallelModel(plan, tensor_group, geometry)
    if tensor_group.size > 1:
        _broadcast_whole(model, group)
    _cut_parameters(model, plan, tensor_group)
    _swap_linears(model, plan, tensor_group)
    state.handles += _wrap_regions(model, plan, tensor_group)
    _refuse_shared_rotary_keys(model, plan)
    state.handles += _localize_attention(model, plan, tensor_group)
    state.handles += _gradient_sums(model, plan, tensor_group)
    held = dict(model.named_parameters())
    heads = [p for p in plan.params.values() if p.kind == "vocab" and p.name in held]
    if heads:
        _install_vocab_loss(model, heads[0].name, tensor_group)
    if tp_overlap_comm:
        state.overlap_body = _install_overlap(model, tensor_group)
    object.__setattr__(model, STATE_ATTR, state)
    return state


def state_of(model: nn.Module) -> TensorParallelModel | None:
    """What parallelize() recorded on `model` (None for a model it did not cut)."""
    return getattr(model, STATE_ATTR, None)


def _broadcast_whole(model: nn.Module, group: Any) -> None:
    # Every rank cuts the same whole weights: tensor rank 0's (a model built without a fixed seed differs).
    src = torch.distributed.get_global_rank(group, 0)
    with torch.no_grad():
        for param in model.parameters():
            dscomm.broadcast(param.data, src, group=group, log_name="tp_broadcast_weights")


def _named_modules(model: nn.Module) -> dict[str, nn.Module]:
    return dict(model.named_modules())


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def _cut_parameters(model: nn.Module, plan: TensorParallelPlan, tensor_group: TensorGroup) -> None:
    params = dict(model.named_parameters())
    for name, pp in plan.params.items():
        if not pp.sharded or name not in params:
            continue
        param = params[name]
        param.data = shard_tensor(param.data, pp, tensor_group.rank, tensor_group.size)
        setattr(param, dscomm.TENSOR_PARALLEL_ATTR, True)


def _swap_linears(model: nn.Module, plan: TensorParallelPlan, tensor_group: TensorGroup) -> None:
    for name, module in list(_named_modules(model).items()):
        if not isinstance(module, nn.Linear):
            continue
        pp = plan.params.get(f"{name}.weight")
        if pp is None or not pp.sharded:
            continue
        in_features, out_features = module.in_features, module.out_features
        if pp.kind in ("column", "vocab"):
            new = ColumnParallelLinear(module.weight, module.bias, tensor_group, gather_output=pp.gather_output,
                                       in_features=in_features, out_features=out_features)
        else:
            new = RowParallelLinear(module.weight, module.bias, tensor_group, split_input=pp.split_input,
                                    in_features=in_features, out_features=out_features)
        parent, child = _parent(model, name)
        setattr(parent, child, new)


def _wrap_regions(model: nn.Module, plan: TensorParallelPlan, tensor_group: TensorGroup) -> list[Any]:
    handles = []
    for name, module in _named_modules(model).items():
        if isinstance(module, (nn.Linear, ColumnParallelLinear, RowParallelLinear)):
            continue
        own = [plan.params.get(f"{name}.{p}" if name else p) for p, _ in module.named_parameters(recurse=False)]
        kinds = {pp.kind for pp in own if pp is not None and pp.sharded}
        if kinds:
            handles += wrap_region(module, tensor_group, enters="column" in kinds, leaves="row" in kinds)
    return handles


def _localize_attention(model: nn.Module, plan: TensorParallelPlan, tensor_group: TensorGroup) -> list[Any]:
    """Attention modules whose projections are cut by heads count their own heads only; a per-head bias
    built for all heads by the model (BLOOM's ALiBi) is sliced to this rank's heads on the way in."""
    tp_size = tensor_group.size
    if tp_size == 1:
        return []
    modules = _named_modules(model)
    attention = set()
    for pp in plan.params.values():
        if pp.kind == "column" and not pp.gather_output and any(w in pp.name for w in ("attn", "attention")):
            owner = pp.name.rsplit(".", 2)[0]  # <attention>.<projection>.weight
            if owner in modules:
                attention.add(owner)
    handles = []
    for name in attention:
        module = modules[name]
        full_heads = getattr(module, "num_heads", None)
        for attr in HEAD_COUNT_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp_size == 0:
                setattr(module, attr, value // tp_size)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "num_attention_heads"):
            local = copy.copy(config)  # the module reads its head counts here (Phi-3); the model's stays whole
            for attr in ("num_attention_heads", "num_key_value_heads"):
                value = getattr(config, attr, None)
                if isinstance(value, int) and value % tp_size == 0:
                    setattr(local, attr, value // tp_size)
            module.config = local
        if isinstance(full_heads, int) and "alibi" in inspect.signature(module.forward).parameters:
            handles.append(module.register_forward_pre_hook(_alibi_slice(full_heads, tensor_group), with_kwargs=True))
    return handles


def _alibi_slice(full_heads: int, tensor_group: TensorGroup):
    local = full_heads // tensor_group.size
    first = tensor_group.rank * local

    def hook(_module, args, kwargs):
        alibi = kwargs.get("alibi")
        if alibi is None or alibi.shape[0] % full_heads:
            return None
        batch = alibi.shape[0] // full_heads
        mine = alibi.view(batch, full_heads, *alibi.shape[1:])[:, first:first + local]
        return args, {**kwargs, "alibi": mine.reshape(batch * local, *alibi.shape[1:])}
    return hook


def _refuse_shared_rotary_keys(model: nn.Module, plan: TensorParallelPlan) -> None:
    """Multi-head latent attention (DeepSeek-V2) feeds one rotary key, from a replicated projection, to every
    head: with the heads cut, each rank's gradient of that key covers its heads only and would go unsummed."""
    for name, module in _named_modules(model).items():
        if hasattr(module, "kv_a_proj_with_mqa") and any(
                pp.sharded and pp.name.startswith(f"{name}.") for pp in plan.params.values()):
            raise TensorParallelError(f"{name}: multi-head latent attention shares one rotary key (from the "
                                      f"replicated kv_a_proj_with_mqa) across its heads; cutting the heads needs "
                                      f"that key's gradient summed over the tensor group, which dstp does not do "
                                      f"yet. Keep self_attn whole (a skip rule for '{name}\\..*') and split the "
                                      f"MLP and experts, or use autotp_size 1")


def _gradient_sums(model: nn.Module, plan: TensorParallelPlan, tensor_group: TensorGroup) -> list[Any]:
    handles = []
    params = dict(model.named_parameters())
    for name, pp in plan.params.items():
        if pp.grad_allreduce and name in params and tensor_group.size > 1:
            def summed(grad: torch.Tensor) -> torch.Tensor:
                grad = grad.clone()
                tensor_group.all_reduce(grad, "tp_replicated_grad_all_reduce")
                return grad
            handles.append(params[name].register_hook(summed))
    return handles


def _install_vocab_loss(model: nn.Module, head_name: str, tensor_group: TensorGroup) -> None:
    if not hasattr(type(model), "loss_function") and not hasattr(model, "loss_function"):
        raise TensorParallelError("tensor_parallel.vocab_parallel_lm_head needs a Hugging Face causal-LM model (its "
                                  "loss_function computes the loss from the sliced logits); this model has none")
    head = model.get_submodule(head_name.rsplit(".", 1)[0])
    local_rows = head.weight.shape[0]
    model.loss_function = VocabParallelCausalLMLoss(tensor_group, tensor_group.rank * local_rows)


def _install_overlap(model: nn.Module, tensor_group: TensorGroup) -> str:
    """Run the module that holds the decoder's layers (a ModuleList of row-parallel layers) as two halves."""
    for name, module in _named_modules(model).items():
        for child in module.children():
            if isinstance(child, nn.ModuleList) and any(isinstance(m, RowParallelLinear) for m in child.modules()):
                _overlap_forward(module, tensor_group)
                return name or type(model).__name__
    raise TensorParallelError("tensor_parallel.tp_overlap_comm: no nn.ModuleList of layers with row-parallel "
                              "linears found to run as two half-batches; turn tp_overlap_comm off for this model")


def _overlap_forward(body: nn.Module, tensor_group: TensorGroup) -> None:
    original = type(body).forward
    takes_use_cache = "use_cache" in inspect.signature(original).parameters

    def forward(self, *args, **kwargs):
        batch = batch_size(args, kwargs)
        cached = kwargs.get("past_key_values") is not None or kwargs.get("use_cache")
        if not (self.training and torch.is_grad_enabled()) or batch is None or batch < 2 or cached:
            return original(self, *args, **kwargs)
        if takes_use_cache:
            kwargs["use_cache"] = False  # each half would fill its own cache; training reads none
        first, second = split_batch((args, kwargs), batch)
        out0, out1 = tensor_group.overlap.run(lambda *a, **k: original(self, *a, **k), first, second)
        return merge_batch(out0, out1)

    body.forward = types.MethodType(forward, body)
