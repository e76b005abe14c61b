"""dscomm's one error type."""


class CommError(RuntimeError):
    """A distributed operation that failed or cannot run; the message names the op, group and ranks."""
