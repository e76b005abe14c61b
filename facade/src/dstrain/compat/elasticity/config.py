"""`deepspeed.elasticity.config`: the elasticity errors and the section's class (dsconfig.elasticity).
`ElasticityConfig(param_dict)` reads and validates a section as DeepSpeed's constructor does."""

from dsconfig.elasticity import ElasticityConfig as _ElasticityConfig
from dsconfig.elasticity import (
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
    read_elasticity,
)


def ElasticityConfig(param_dict: dict) -> _ElasticityConfig:
    """The `elasticity` section `param_dict`, validated (ElasticityConfigError listing every problem)."""
    return read_elasticity(param_dict)


__all__ = ["ElasticityConfig", "ElasticityConfigError", "ElasticityError", "ElasticityIncompatibleWorldSize"]
