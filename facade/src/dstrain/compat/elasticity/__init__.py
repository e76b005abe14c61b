"""`deepspeed.elasticity`: DeepSpeed's elastic batch-size arithmetic (dsconfig.elasticity, a pure function of the
section and the world size). This module adds what DeepSpeed reads from the environment: `WORLD_SIZE` for version
0.2 when no world size is passed, and the resource scheduler's copy of the section (DEEPSPEED_ELASTICITY_CONFIG).
The version of this dstrain (what `deepspeed.git_version_info.version` answers) counts as a target that has
elasticity; any other target must be a DeepSpeed version of 0.3.8 or later."""

from __future__ import annotations

import os

from dsconfig import elasticity as _elasticity

from ... import __version__
from ...wiring.elastic import check_scheduler_copy
from . import config

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
    """The section the resource scheduler saw (DEEPSPEED_ELASTICITY_CONFIG: the elasticity section as JSON, as
    DeepSpeed reads it) must agree with the runtime's on the batch, micro-batches and version; without it, nothing
    to check. The engine runs this check itself when the config enables elasticity."""
    check_scheduler_copy(runtime_elastic_config_dict)


__all__ = ["DEEPSPEED_ELASTICITY_CONFIG", "ELASTICITY", "ENABLED", "ENABLED_DEFAULT", "compute_elastic_config",
           "config", "elasticity_enabled", "ensure_immutable_elastic_config"]
