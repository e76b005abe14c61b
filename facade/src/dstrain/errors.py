"""The facade's errors: each names the argument, key or file at fault and what would be valid."""

from dsconfig import ConfigError


class DstrainError(RuntimeError):
    """A training script asked the engine for something it cannot do as asked."""


class UnsupportedFeatureError(ConfigError):
    """A config key turns on a feature that no installed dstrain library provides."""


class CheckpointLoadError(DstrainError):
    """A checkpoint that is missing, incomplete, or does not match the engine."""


class EngineUsageError(DstrainError, AssertionError):
    """An engine method called where DeepSpeed's asserts it cannot be (engine.step() inside no_sync(), ...). An
    AssertionError too, the type DeepSpeed raises there."""


class MissingModelError(DstrainError, TypeError, AssertionError):
    """initialize() called without a model. A TypeError (a required argument is missing) and an AssertionError too:
    DeepSpeed asserts the model is given, and scripts catch that type."""


class CheckpointTagError(DstrainError, AssertionError):
    """Ranks saving under different tags with checkpoint.tag_validation "Fail". An AssertionError too: DeepSpeed
    raises that type here, and scripts catch it."""


__all__ = ["CheckpointLoadError", "CheckpointTagError", "ConfigError", "DstrainError", "EngineUsageError", "MissingModelError",
           "UnsupportedFeatureError"]
