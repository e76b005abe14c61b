"""Step 5 of compose(): the pipeline split (dspipe), and what initialize() asks of a PipelineModule.

A PipelineModule has split itself already (each rank built only its stages' layers), so the split
step checks that the module and the run agree, applies the config's `pipeline` section where it still
can act (DeepSpeed fills `stages` and `partition` in and never reads them: here each is checked against
the module, never ignored), and hands ZeRO parameter groups in which the weights tied across stages
carry "norm_replicas" (dszero counts them once in the gradient norm).

The layout's pipe degree is the module's number of stages; the batch triple resolves at the
data-parallel size, world / (pipe x tensor).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError
from ..logs import log_on_rank0
from .optional_libs import imported

if TYPE_CHECKING:
    from dspipe import PipelineModule

# What "1f1b" (the config's default) means for modules cut for other schedules.
_NATURAL = {"v": "dualpipev", "interleaved": "interleaved_1f1b"}
_PARTITIONS = ("best", "parameters", "uniform", "profile", "type:<regex>")


def is_pipeline_module(model: Any) -> bool:
    if not imported("dspipe"):  # dspipe is optional: without it no model is a PipelineModule
        return False
    from dspipe import PipelineModule

    return isinstance(model, PipelineModule)


def pipeline_degree(model: Any, degrees: dict[str, int]) -> int:
    """The pipe degree of the run: a PipelineModule's num_stages (pipeline.stages, when given, must say the
    same), else what the config asks (parallel_dims refuses it for a plain module)."""
    asked = degrees.get("pipeline.stages", 1)
    if not is_pipeline_module(model):
        return asked
    if asked > 1 and asked != model.num_stages:
        raise ConfigError(Problem("pipeline.stages", f"is {asked} but the PipelineModule was built with num_stages="
                                                     f"{model.num_stages}; layers are placed when the module is built, "
                                                     f"so set them equal or leave pipeline.stages out", asked))
    return model.num_stages


def apply_pipeline_split(composed: Any, config: DeepSpeedConfig, groups: Any) -> Any:
    """Check a PipelineModule against the run and hand ZeRO its parameter groups (no-op for other models)."""
    model = composed.model
    if not is_pipeline_module(model):
        return composed
    if groups is not None and groups.dims != model.dims:
        dims = groups.dims
        if dims.tensor != model.dims.tensor:  # 3D: the module must know the tensor axis its stages are cut over
            raise UnsupportedFeatureError([Problem(
                "tensor_parallel.autotp_size", f"this run lays out {dims}, but the PipelineModule was built for "
                                               f"{model.dims}: build it with topology=dstrain.pipe."
                                               f"PipeModelDataParallelTopology(num_pp={dims.pipe}, num_mp="
                                               f"{dims.tensor}, num_dp={dims.data}) (as Megatron-DeepSpeed does)",
                dims.tensor)])
        raise UnsupportedFeatureError([Problem(
            "pipeline.stages", f"the PipelineModule was built for the layout {model.dims}, but this run lays out "
                               f"{groups.dims}: build the module after init_distributed() with num_stages equal to "
                               f"the pipeline degree", model.num_stages)])
    section = config.pipeline
    _check_partition(section.partition, model)
    if section.seed_layers and not model.seed_layers:
        raise ConfigError(Problem("pipeline.seed_layers", "layers are seeded when the PipelineModule builds them, "
                                                          "before initialize() reads the config: pass "
                                                          "PipelineModule(..., seed_layers=True) instead", True))
    if section.activation_checkpoint_interval > 0:  # as DeepSpeed: the config's interval wins over the module's
        model.set_checkpoint_interval(section.activation_checkpoint_interval)
    parameters = tied_aware_groups(composed.model_parameters, model)
    return dataclasses.replace(composed, model_parameters=parameters)


def _check_partition(partition: str, model: PipelineModule) -> None:
    wanted = partition.lower()
    valid = wanted in ("best", "parameters", "uniform", "profile") or wanted.startswith("type:")
    if not valid:
        raise ConfigError(Problem("pipeline.partition", f"is not a partition method; valid: {', '.join(_PARTITIONS)}",
                                  partition))
    if wanted != "best" and wanted != str(model.partition_method).lower():
        raise ConfigError(Problem(
            "pipeline.partition", f"asks for {partition!r} but the PipelineModule was partitioned with "
                                  f"partition_method={model.partition_method!r} when it was built; pass "
                                  f"partition_method={partition!r} to PipelineModule, or set \"best\" (the module's "
                                  f"choice)", partition))


def tied_aware_groups(model_parameters: Any, model: torch.nn.Module) -> list[dict[str, Any]] | Any:
    """The optimizer's parameter groups with the weights tied across pipeline ranks in groups of their own,
    whose "norm_replicas" counts the copies (multiplied into any the group had)."""
    if model_parameters is None:
        model_parameters = model.parameters()
    given = list(model_parameters)
    groups = given if given and isinstance(given[0], dict) else [{"params": given}]
    if not any(dscomm.pipeline_tied_copies(p) > 1 for g in groups for p in _params(g)):
        return given
    split: list[dict[str, Any]] = []
    for group in groups:
        hyper = {k: v for k, v in group.items() if k != "params"}
        by_copies: dict[int, list[torch.Tensor]] = {}
        for param in _params(group):
            by_copies.setdefault(dscomm.pipeline_tied_copies(param), []).append(param)
        for copies, params in sorted(by_copies.items()):
            extra = {"norm_replicas": copies * hyper.get("norm_replicas", 1)} if copies > 1 else {}
            split.append({**hyper, **extra, "params": params})
    return split


def _params(group: dict[str, Any]) -> list[torch.Tensor]:
    params = group["params"]
    return [params] if torch.is_tensor(params) else list(params)


def choose_schedule(config: DeepSpeedConfig, model: PipelineModule) -> str:
    """pipeline.schedule, where the module can run it; the default "1f1b" means the module's own schedule
    for a DualPipeVModule (dualpipev) or a module cut into chunks (interleaved_1f1b)."""
    from dspipe.runtime import check_schedule
    from dspipe.schedules import schedule_name

    asked = schedule_name(config.pipeline.schedule)
    placement = model.placement
    shape = "v" if placement.shape == "v" else ("interleaved" if placement.stages > placement.ranks else "loop")
    name = _NATURAL.get(shape, asked) if asked == "1f1b" else asked
    try:
        check_schedule(name, placement)
    except Exception as exc:
        raise ConfigError(Problem("pipeline.schedule", str(exc), config.pipeline.schedule)) from None
    if name != asked:
        log_on_rank0(dscomm.get_rank(), f"pipeline: {type(model).__name__} runs the {name} schedule "
                                        f"(pipeline.schedule is the default 1f1b)")
    return name


def refuse_zero_stage_3(config: DeepSpeedConfig) -> None:
    if config.zero_optimization.stage == 3:
        raise UnsupportedFeatureError([Problem(
            "zero_optimization.stage", "ZeRO stage 3 beside a pipeline is not supported: stage 3 reduce-scatters "
                                       "each gradient during the backward that produces it, but a pipeline "
                                       "schedule accumulates gradients over many micro-batch backwards (and "
                                       "splits them into input and weight passes) before one reduction; use "
                                       "stage 1 or 2, which hold gradients back until the schedule's end", 3)])

