"""`initialize()`: DeepSpeed's entry point, with DeepSpeed's arguments and return values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

import dscomm
from dsconfig import ConfigError, Problem

from .engine.deepspeed_engine import DeepSpeedEngine
from .errors import DstrainError, MissingModelError
from .logs import set_log_level
from .wiring import dsseq as wiring_dsseq
from .wiring.compose import compose
from .wiring.config_source import load_config, pick_source
from .wiring.dspipe import is_pipeline_module, pipeline_degree
from .wiring.dstp import check_mpu, mpu_tensor_size
from .wiring.elastic import check_elastic_run
from .wiring.feature_gate import check_features
from .wiring.layout import data_parallel_size, parallel_dims, requested_degrees

if TYPE_CHECKING:
    from .engine.pipeline_engine import PipelineEngine


def initialize(args: Any = None, model: torch.nn.Module | None = None, optimizer: Any = None,
               model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = 29500, mpu: Any = None, dist_init_required: bool | None = None,
               collate_fn: Any = None, config: Any = None, mesh_param: Any = None, config_params: Any = None,
               *, strict_config: bool = False) -> tuple[DeepSpeedEngine | PipelineEngine, Any, Any, Any]:
    """Build the training engine: returns (engine, optimizer, training_dataloader, lr_scheduler).

    The config comes from `config` (a path, a dict or a base64 string), `config_params`, or
    `args.deepspeed_config`. Unknown config keys warn (strict_config=True makes them errors);
    a key that turns on a feature dstrain lacks is always an error. The run's layout (ParallelDims)
    is built from the config once, registered for dscomm.groups' getters, and its data group (sequence x
    data with sequence_parallel_size) is where ZeRO partitions and reduces. A dspipe PipelineModule gets a
    PipelineEngine, its stages the pipe axis. `mpu`: a Megatron-style tensor-parallel one, or the groups of
    UlyssesSPAttentionHF.register_with_transformers (reused as the run's layout).
    """
    if model is None:
        raise MissingModelError("initialize() needs model=<your torch.nn.Module> (the first positional argument is "
                                "args, as in DeepSpeed: pass the model by name)")
    if mesh_param is not None:
        raise DstrainError("initialize(mesh_param=...): device meshes are not part of dstrain yet; give the layout "
                           "in the config (tensor_parallel.autotp_size) or pass a Megatron-style mpu")
    _start_distributed(distributed_port, dist_init_required)
    world = dscomm.get_world_size()
    source = pick_source(args, config, config_params)
    # The batch triple resolves at the data-parallel size: the world over pipe x tensor x sequence (an mpu's,
    # if given).
    degrees = requested_degrees(source)
    degrees["pipeline.stages"] = pipeline_degree(model, degrees)  # a PipelineModule's own stages
    sequence_mpu = mpu is not None and wiring_dsseq.is_sequence_mpu(mpu)
    if sequence_mpu:
        degrees["sequence_parallel_size"] = wiring_dsseq.mpu_sequence_size(mpu, degrees.get("sequence_parallel_size", 1))
    if mpu is not None and (not sequence_mpu or callable(getattr(mpu, "get_tensor_model_parallel_world_size", None))):
        # (a sequence mpu's tensor size only where it has one of its own: parallel_state_sp's "model parallel" is
        # its sequence group)
        degrees["tensor_parallel.autotp_size"] = mpu_tensor_size(mpu, degrees.get("tensor_parallel.autotp_size", 1))
    cfg, raw = load_config(source, data_parallel_size(degrees, world), strict=strict_config)
    cfg = wiring_dsseq.with_sequence_settings(cfg, degrees.get("sequence_parallel_size", 1))
    check_features(cfg, raw)
    check_elastic_run(cfg, world, dscomm.get_rank())
    if cfg.log_level is not None:  # before the engine's own lines, as DeepSpeed sets it
        set_log_level(cfg.log_level)
    # The degrees read above (the config's, a PipelineModule's stages, an mpu's size) lay out the run.
    dims = parallel_dims(degrees, world, engine_runs_pipe=is_pipeline_module(model))
    wiring_dsseq.check_composition(cfg, model)
    groups = wiring_dsseq.groups_for(dims, mpu if sequence_mpu else None)  # collective
    if mpu is not None and not sequence_mpu:
        check_mpu(mpu, groups)
    dscomm.groups.use(groups)
    composed = compose(model, cfg, groups, model_parameters)  # every parallelism, in its one order
    # An autotuning experiment (the launcher's --autotuning) measures its profile steps and ends the run.
    from .autotuning.engine_metrics import experiment_hooks  # the tuner's code loads only for its runs

    composed.step_hooks.extend(experiment_hooks(cfg, composed.model, rank=dscomm.get_rank()))
    engine_type = _pipeline_engine() if is_pipeline_module(composed.model) else DeepSpeedEngine
    engine = engine_type(model=composed.model, config=cfg, optimizer=optimizer,
                             model_parameters=composed.model_parameters, training_data=training_data,
                             lr_scheduler=lr_scheduler, collate_fn=collate_fn,
                             data_parallel_group=wiring_dsseq.zero_group(groups),
                             groups=groups, step_hooks=composed.step_hooks)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _pipeline_engine() -> type[PipelineEngine]:
    from .engine.pipeline_engine import (
        PipelineEngine,  # dspipe is optional: imported only for a PipelineModule
    )

    return PipelineEngine


def _start_distributed(port: int, required: bool | None) -> None:
    if dscomm.is_initialized():
        return
    if required is False and torch.distributed.is_initialized() is False:
        raise ConfigError(Problem("dist_init_required", "is False but torch.distributed is not initialized: call "
                                                        "dstrain.init_distributed() first or leave it None"))
    dscomm.init_distributed(distributed_port=port, dist_init_required=required)
