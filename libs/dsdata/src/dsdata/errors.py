"""dsdata's one error type."""


class DataEfficiencyError(ValueError):
    """A curriculum, data-analysis, sampling or random-LTD setting or input that cannot work; the message
    names the key, file or argument and what would be valid."""
