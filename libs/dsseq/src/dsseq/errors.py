"""dsseq's one error type."""


class SequenceParallelError(ValueError):
    """A sequence-parallel layout, head split or batch that cannot run; the message names the tensor,
    argument or config key, the numbers involved and what would be valid."""
