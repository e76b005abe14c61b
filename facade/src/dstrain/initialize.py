"""`initialize()`: DeepSpeed's entry point, with DeepSpeed's arguments and return values."""

from __future__ import annotations

from typing import Any

import torch

import dscomm
from dsconfig import ConfigError, Problem

from .compose import compose
from .config_source import load_config, pick_source
from .engine import DeepSpeedEngine
from .errors import DstrainError
from .feature_gate import check_features
from .layout import parallel_dims


def initialize(args: Any = None, model: torch.nn.Module | None = None, optimizer: Any = None,
               model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = 29500, mpu: Any = None, dist_init_required: bool | None = None,
               collate_fn: Any = None, config: Any = None, mesh_param: Any = None, config_params: Any = None,
               *, strict_config: bool = False) -> tuple[DeepSpeedEngine, Any, Any, Any]:
    """Build the training engine: returns (engine, optimizer, training_dataloader, lr_scheduler).

    The config comes from `config` (a path, a dict or a base64 string), `config_params`, or
    `args.deepspeed_config`. Unknown config keys warn (strict_config=True makes them errors);
    a key that turns on a feature dstrain lacks is always an error. The run's layout (ParallelDims)
    is built from the config once, registered for dscomm.groups' getters, and its data group is
    where ZeRO partitions and reduces.
    """
    if model is None:
        raise TypeError("initialize() needs model=<your torch.nn.Module>")
    if mpu is not None or mesh_param is not None:
        raise DstrainError("initialize(mpu=..., mesh_param=...): model/tensor parallelism is not part of dstrain yet; "
                           "remove the argument to train data-parallel")
    _start_distributed(distributed_port, dist_init_required)
    world = dscomm.get_world_size()
    source = pick_source(args, config, config_params)
    # The plain engine's layout is all data parallel, so the batch triple resolves at the world size.
    cfg, raw = load_config(source, world, strict=strict_config)
    check_features(cfg, raw)
    groups = parallel_dims(cfg, world).build()  # collective: every rank creates every group
    dscomm.groups.use(groups)
    composed = compose(model, cfg, groups, model_parameters)  # every parallelism, in its one order
    engine = DeepSpeedEngine(model=composed.model, config=cfg, optimizer=optimizer,
                             model_parameters=composed.model_parameters, training_data=training_data,
                             lr_scheduler=lr_scheduler, collate_fn=collate_fn, data_parallel_group=groups.data,
                             groups=groups)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _start_distributed(port: int, required: bool | None) -> None:
    if dscomm.is_initialized():
        return
    if required is False and torch.distributed.is_initialized() is False:
        raise ConfigError(Problem("dist_init_required", "is False but torch.distributed is not initialized: call "
                                                        "dstrain.init_distributed() first or leave it None"))
    dscomm.init_distributed(distributed_port=port, dist_init_required=required)
