"""An elastic run (the config's `elasticity` section): dsconfig picked the batch triple for this data-parallel size;
here the run is checked against what the elastic arithmetic assumed (its replicas' width, the resource scheduler's
copy of the section) and the sizes the job may be restarted at are logged."""

from __future__ import annotations

import json
import os

from dsconfig import DeepSpeedConfig, Problem
from dsconfig.elasticity import (
    DEEPSPEED_ELASTICITY_CONFIG,
    ElasticityConfigError,
    check_same_elastic_config,
    elastic_batch,
)

from ..logs import log_on_rank0


def check_scheduler_copy(runtime_section: dict) -> None:
    """The `elasticity` section the resource scheduler scaled this job with (DEEPSPEED_ELASTICITY_CONFIG, JSON, as
    DeepSpeed reads it) must agree with the runtime's on the batch, micro batches and version, or the scheduler
    may restart the job at a size the runtime's batch does not divide. Unset: nothing to compare."""
    text = os.environ.get(DEEPSPEED_ELASTICITY_CONFIG)
    if text is None:
        return
    try:
        scheduler = json.loads(text)
    except ValueError as exc:
        raise ElasticityConfigError(Problem(DEEPSPEED_ELASTICITY_CONFIG, f"is not JSON ({exc}); it holds the "
                                                                         f"scheduler's elasticity section")) from None
    check_same_elastic_config(runtime_section, scheduler)


def check_elastic_run(cfg: DeepSpeedConfig, world_size: int, rank: int) -> None:
    """Refuse an elastic run laid out otherwise than its arithmetic assumed, and log the sizes it may run at."""
    elastic = cfg.elasticity
    if not elastic.enabled:
        return
    width = world_size // cfg.data_parallel_size  # ranks per model replica: pipeline x tensor x sequence
    if width != elastic.model_parallel_size:
        raise ElasticityConfigError(Problem(
            "elasticity.model_parallel_size", f"the elastic batch assumes model replicas {elastic.model_parallel_size} "
                                              f"rank(s) wide, but this run's are {width} (world {world_size}, data-"
                                              f"parallel size {cfg.data_parallel_size}); set model_parallel_size to "
                                              f"{width} (elasticity version 0.2)", elastic.model_parallel_size))
    check_scheduler_copy(elastic.to_dict())
    batch = elastic_batch(elastic, cfg.data_parallel_size)
    log_on_rank0(rank, f"elasticity: train_batch_size {batch.train_batch_size} = micro batch "
                       f"{batch.train_micro_batch_size_per_gpu} x {batch.gradient_accumulation_steps} accumulation "
                       f"step(s) x {cfg.data_parallel_size} data-parallel rank(s); the same batch at data-parallel "
                       f"sizes {list(batch.valid_world_sizes)}")
