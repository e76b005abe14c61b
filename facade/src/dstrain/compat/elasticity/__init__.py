"""`deepspeed.elasticity`: DeepSpeed's elastic batch-size arithmetic (dsconfig.elasticity, a pure function of the
section and the world size). This module adds what DeepSpeed reads from the environment: `WORLD_SIZE` for version
0.2 when no world size is passed, and the resource scheduler's copy of the section (DEEPSPEED_ELASTICITY_CONFIG).
The version of this dstrain (what `deepspeed.git_version_info.version` answers) counts as a target that has
elasticity; any other target must be a DeepSpeed version of 0.3.8 or later."""

from __future__ import annotations

import json
import os

from dsconfig import elasticity as _elasticity

from ... import __version__
from . import config
from .config import ElasticityConfigError

ELASTICITY = "elasticity"
ENABLED = "enabled"
ENABLED_DEFAULT = False
LATEST_ELASTICITY_VERSION = _elasticity.LATEST_ELASTICITY_VERSION
MINIMUM_DEEPSPEED_VERSION = _elasticity.MINIMUM_DEEPSPEED_VERSION
DEEPSPEED_ELASTICITY_CONFIG = _elasticity.DEEPSPEED_ELASTICITY_CONFIG
elasticity_enabled = _elasticity.elasticity_enabled


def _world_size_from_environment() -> int | None:
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


def compute_elastic_config(ds_config: dict, target_deepspeed_version: str, world_size: int = 0,
                           return_microbatch: bool = False):
    """DeepSpeed's `compute_elastic_config` (see dsconfig.elasticity.compute_elastic_config)."""
    target = None if target_deepspeed_version == __version__ else target_deepspeed_version
    return _elasticity.compute_elastic_config(ds_config, target, world_size, return_microbatch,
                                              running_world_size=_world_size_from_environment())


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict) -> None:
    """The section the resource scheduler saw (DEEPSPEED_ELASTICITY_CONFIG: a whole config or the section, as
    JSON) must agree with the runtime's on the batch, micro-batches and version; without it, nothing to check."""
    text = os.environ.get(DEEPSPEED_ELASTICITY_CONFIG)
    if text is None:
        return
    try:
        scheduler = json.loads(text)
    except ValueError as exc:
        raise ElasticityConfigError(f"{DEEPSPEED_ELASTICITY_CONFIG} is not JSON: {exc}") from None
    if isinstance(scheduler, dict) and isinstance(scheduler.get(ELASTICITY), dict):
        scheduler = scheduler[ELASTICITY]
    _elasticity.check_same_elastic_config(runtime_elastic_config_dict, scheduler)


__all__ = ["DEEPSPEED_ELASTICITY_CONFIG", "ELASTICITY", "ENABLED", "ENABLED_DEFAULT", "compute_elastic_config",
           "config", "elasticity_enabled", "ensure_immutable_elastic_config"]
