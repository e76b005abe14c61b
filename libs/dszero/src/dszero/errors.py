"""dszero's errors."""


class ZeroError(RuntimeError):
    """ZeRO cannot do what was asked; the message says what, where (rank, parameter, file) and what is valid."""


class ZeroConfigError(ZeroError, ValueError):
    """A ZeRO setting or argument that is not valid."""


class CheckpointError(ZeroError):
    """A checkpoint that cannot be written or read: missing shard, wrong model, incomplete save."""


class UnusedParametersError(ZeroError, AssertionError):
    """Parameters got no gradient while zero_optimization.ignore_unused_parameters is false. An AssertionError too:
    DeepSpeed raises that type here, and scripts catch it."""
