"""dsmoe's one error type."""


class MoEError(ValueError):
    """An MoE layer, gate or expert layout that cannot work; the message names the value, where it came
    from and what would be valid."""
