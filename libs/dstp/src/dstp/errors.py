"""dstp's one error type."""


class TensorParallelError(ValueError):
    """A tensor-parallel plan or layout that cannot run; the message names the parameter, rule or config
    key, the numbers involved and what would be valid."""
