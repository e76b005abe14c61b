"""`deepspeed.runtime.config`: the config classes, from dsconfig (`DeepSpeedConfig`, `DeepSpeedConfigError`)."""

from dsconfig import ConfigError as DeepSpeedConfigError
from dsconfig import DeepSpeedConfig

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError"]
