"""dszero's errors."""


class ZeroError(RuntimeError):
    """ZeRO cannot do what was asked; the message says what, where (rank, parameter, file) and what is valid."""


class ZeroConfigError(ZeroError, ValueError):
    """A ZeRO setting or argument that is not valid."""


class CheckpointError(ZeroError):
    """A checkpoint that cannot be written or read: missing shard, wrong model, incomplete save."""
