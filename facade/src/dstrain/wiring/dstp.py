"""Step 1 of compose(): AutoTP tensor parallelism (dstp) from the config's `tensor_parallel` section.

The model is cut over the layout's tensor group before anything else sees it; the optimizer's
parameters then come back as parameter groups in which every tensor-replicated parameter carries
`"norm_replicas": tp_size` (dszero's key), so ZeRO, partitioning over the data group, computes the
global gradient norm with each shard counted once per tensor rank and each replicated weight once.

A PipelineModule (3D parallelism, as Megatron-DeepSpeed runs it) holds only its stage's layers; its
plan is planned over every stage's parameters (gathered over the pipe group), so each stage cuts its
layers by the whole model's plan, a rule is checked against every parameter it may match, and a
checkpoint records one plan that merges and cuts every layer file.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError
from .across_stages import across_stages, several_stages
from .optional_libs import require

TP_INIT_ATTR = "_dstrain_tp_model_init"  # what dstrain.tp_model_init recorded on a model


def tensor_degree(config: DeepSpeedConfig) -> int:
    return max(config.tensor_parallel.autotp_size, 1)


def apply_tensor_parallel(composed: Any, config: DeepSpeedConfig, groups: Any) -> Any:
    """Cut composed.model by the plan of `config` over groups.tensor (no-op at autotp_size 0 or 1)."""
    model = composed.model
    tp_size = tensor_degree(config)
    check_tp_model_init(model, config)
    if tp_size == 1:
        if groups is not None and groups.size("tensor") > 1:  # a Megatron mpu's model, parallel already
            mark_megatron_shards(model)
            parameters = replica_aware_groups(composed.model_parameters, model, groups.size("tensor"))
            return dataclasses.replace(composed, model_parameters=parameters)
        return composed
    section = config.tensor_parallel
    checkpointed = getattr(model, "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing")
                           else "is_gradient_checkpointing", False)
    if section.tp_overlap_comm and checkpointed:
        raise UnsupportedFeatureError([Problem("tensor_parallel.tp_overlap_comm",
                                               "runs two half-batches as coroutines, which activation checkpointing "
                                               "(gradient_checkpointing_enable) would mix up; turn one of them off",
                                               True)])
    if section.vocab_parallel_lm_head and several_stages(model, groups):
        raise UnsupportedFeatureError([Problem("tensor_parallel.vocab_parallel_lm_head",
                                               "slices the logits for a Hugging Face model's loss_function, but a "
                                               "pipeline computes its loss with the PipelineModule's loss_fn on the "
                                               "last stage; turn it off (the LM head stays whole)", True)])
    dstp = require("dstp", "tensor_parallel.autotp_size > 1 (AutoTP)")
    try:
        plan = dstp.plan_for(model, tp_size, preset_model=section.preset_model,
                             partition_config=section.partition_config,
                             vocab_parallel_lm_head=section.vocab_parallel_lm_head,
                             params=pipeline_params(model, groups, dstp), keep_whole=autoep_placed(model, config, groups),
                             keep_whole_why="expert_parallel (AutoEP places the experts and routers)",
                             model_level_plan="autotp" not in config.compile.passes)  # the pass gathers no output
        state = dstp.parallelize(model, groups.tensor, plan, tp_overlap_comm=section.tp_overlap_comm)
    except dstp.TensorParallelError as exc:
        raise ConfigError(Problem("tensor_parallel", str(exc))) from None
    if dscomm.get_rank() == 0:
        from dstp.plan import plan_summary

        from ..logs import log_on_rank0

        summary = plan_summary(state.plan)
        log_on_rank0(0, f"AutoTP: {tp_size} tensor ranks, rules from {state.plan.source}: {summary}")
    parameters = replica_aware_groups(composed.model_parameters, model, tp_size)
    return dataclasses.replace(composed, model_parameters=parameters)


def autoep_placed(model: torch.nn.Module, config: DeepSpeedConfig, groups: Any) -> list[str]:
    """The modules AutoEP will place (step 2): experts split over expert-parallel ranks, routers replicated;
    the tensor plan keeps them whole."""
    if not config.expert_parallel.enabled:
        return []
    from .autoep import hf_config, on_every_stage

    autoep = require("dsmoe.autoep", "expert_parallel.enabled (AutoEP)")
    return on_every_stage(lambda: autoep.placed_modules(model, config.expert_parallel, model_config=hf_config(model)),
                          model, groups)


def pipeline_params(model: torch.nn.Module, groups: Any, dstp: Any) -> list[Any] | None:
    """Every pipeline stage's parameters as dstp plans them (None for a model that is not a pipeline of
    several stages); collective over the pipe group."""
    if not several_stages(model, groups):
        return None
    merged: dict[str, Any] = {}
    for stage in across_stages([dataclasses.asdict(info) for info in dstp.param_infos(model)], model, groups):
        for raw in stage:  # a tied module is on several stages, alike
            merged.setdefault(raw["name"], dstp.ParamInfo(raw["name"], tuple(raw["shape"]), raw["module_kind"],
                                                          tuple(raw["aliases"])))
    return list(merged.values())


def replica_aware_groups(model_parameters: Any, model: torch.nn.Module, tp_size: int) -> list[dict[str, Any]]:
    """The optimizer's parameter groups, each split in two: the tensor-parallel shards, and the
    parameters every tensor rank holds whole (with "norm_replicas": tp_size)."""
    if model_parameters is None:
        model_parameters = model.parameters()
    given = list(model_parameters)
    groups = given if given and isinstance(given[0], dict) else [{"params": given}]
    split: list[dict[str, Any]] = []
    for group in groups:
        params = list(group["params"]) if not torch.is_tensor(group["params"]) else [group["params"]]
        hyper = {k: v for k, v in group.items() if k != "params"}
        shards = [p for p in params if dscomm.is_tensor_parallel(p)]
        whole = [p for p in params if not dscomm.is_tensor_parallel(p)]
        if shards:
            split.append({**hyper, "params": shards})
        if whole:
            split.append({**hyper, "params": whole, "norm_replicas": tp_size * hyper.get("norm_replicas", 1)})
    return split


def check_tp_model_init(model: torch.nn.Module, config: DeepSpeedConfig) -> None:
    """tp_model_init's recorded arguments agree with the config, which is the canonical source (as in
    DeepSpeed); without a tensor_parallel section there is no layout to run them in."""
    recorded = getattr(model, TP_INIT_ATTR, None)
    if recorded is None:
        return
    size = config.tensor_parallel.autotp_size
    if size in (0, 1) and recorded["tp_size"] > 1:
        raise ConfigError(Problem("tensor_parallel.autotp_size",
                                  f"tp_model_init(tp_size={recorded['tp_size']}) was called but the config has no "
                                  f"tensor_parallel.autotp_size; add \"tensor_parallel\": {{\"autotp_size\": "
                                  f"{recorded['tp_size']}}} (the config drives AutoTP)", size))
    if size > 1 and recorded["tp_size"] != size:
        raise ConfigError(Problem("tensor_parallel.autotp_size",
                                  f"differs from tp_model_init(tp_size={recorded['tp_size']}); make them agree", size))


def tp_model_init(model: torch.nn.Module, tp_size: int, dtype: torch.dtype, config: Any = None,
                  **kwargs: Any) -> torch.nn.Module:
    """DeepSpeed's tp_model_init, kept for old scripts: it only records its arguments on the model;
    initialize() applies AutoTP from the config's tensor_parallel section and checks they agree."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tp_model_init(model=...) must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(Problem("tp_model_init.tp_size", "must be a positive integer", tp_size))
    if kwargs.get("tp_group") is not None:
        raise UnsupportedFeatureError([Problem("tp_model_init.tp_group", "dstrain builds the tensor group from the "
                                                                         "config's layout; leave tp_group out", True)])
    object.__setattr__(model, TP_INIT_ATTR, {"tp_size": tp_size, "dtype": dtype, "config": config})
    return model


# ---------------------------------------------------------------------------------------------- a Megatron mpu
MEGATRON_TP_ATTRS = ("tensor_model_parallel", "model_parallel")  # how Megatron marks its shards


def mpu_tensor_size(mpu: Any, autotp: int) -> int:
    """The model-parallel size of a Megatron-style `mpu` (get_model_parallel_world_size or
    get_tensor_model_parallel_world_size); it must agree with tensor_parallel.autotp_size when both are set."""
    for getter in ("get_tensor_model_parallel_world_size", "get_model_parallel_world_size"):
        if callable(getattr(mpu, getter, None)):
            size = int(getattr(mpu, getter)())
            break
    else:
        raise ConfigError(Problem("mpu", f"{type(mpu).__name__} has neither get_tensor_model_parallel_world_size() "
                                         f"nor get_model_parallel_world_size(); pass a Megatron-style mpu"))
    if autotp > 1 and autotp != size:
        raise ConfigError(Problem("tensor_parallel.autotp_size", f"differs from the mpu's model-parallel size {size}",
                                  autotp))
    return size


def check_mpu(mpu: Any, groups: Any) -> None:
    """The mpu's data- and model-parallel groups hold the same ranks as the layout's (tensor fastest)."""
    for name, getters in (("data", ("get_data_parallel_group",)),
                          ("tensor", ("get_tensor_model_parallel_group", "get_model_parallel_group"))):
        getter = next((g for g in getters if callable(getattr(mpu, g, None))), None)
        if getter is None:
            raise ConfigError(Problem("mpu", f"{type(mpu).__name__} lacks {' / '.join(getters)}()"))
        ranks = dscomm.groups.get_group_ranks(getattr(mpu, getter)())
        if list(ranks) != groups.ranks(name):
            raise UnsupportedFeatureError([Problem("mpu", f"its {getter}() holds ranks {list(ranks)} on rank "
                                                          f"{dscomm.get_rank()}, but dstrain lays out {groups.dims} "
                                                          f"with the {name} group {groups.ranks(name)} (tensor ranks "
                                                          f"adjacent, as Megatron's default order)", True)])


def mark_megatron_shards(model: torch.nn.Module) -> int:
    """Tag the parameters Megatron marks as model-parallel shards with dscomm's tag; returns how many."""
    count = 0
    for param in model.parameters():
        if any(getattr(param, attr, False) for attr in MEGATRON_TP_ATTRS):
            setattr(param, dscomm.TENSOR_PARALLEL_ATTR, True)
            count += 1
    return count


def compile_autotp(engine: Any, backend: str, compile_kwargs: dict | None) -> Any:
    """engine.compile() with `"compile": {"deepcompile": true, "passes": ["autotp"]}`: the model, cut by AutoTP
    at initialize() as always, compiled with its tensor-parallel collectives in the graph (dstp's autotp pass)
    instead of inside the layers. ZeRO 0-2 reduce the gradients as for any module; returns dstp's runtime."""
    config = engine._config
    problems = []
    if config.zero_optimization.stage == 3:
        problems.append(Problem("zero_optimization.stage", "the autotp pass runs with ZeRO stages 0-2 (DeepSpeed's "
                                                           "example uses 0); stage 3's gathers are DeepCompile's ZeRO "
                                                           "passes, which do not run beside it", 3))
    other = [name for name in config.compile.passes if name != "autotp"]
    if other:
        problems.append(Problem("compile.passes", f"autotp runs alone; remove {other}", config.compile.passes))
    if problems:
        raise UnsupportedFeatureError(problems)
    dstp = require("dstp", "compile.passes \"autotp\"")
    try:
        return dstp.compile_autotp(engine.module, backend=backend, compile_kwargs=compile_kwargs)
    except dstp.TensorParallelError as exc:
        raise UnsupportedFeatureError([Problem("compile.passes", str(exc), config.compile.passes)]) from None


def is_autotp_runtime(runtime: Any) -> bool:
    module = sys.modules.get("dstp")
    return module is not None and isinstance(runtime, module.AutoTPRuntime)


def uncompile_autotp(runtime: Any) -> None:
    sys.modules["dstp"].uncompile_autotp(runtime)
