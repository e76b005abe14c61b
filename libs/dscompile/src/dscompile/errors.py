"""dscompile's one error class."""


class DeepCompileError(ValueError):
    """A DeepCompile setting, schedule or model that cannot run as asked; the message names the key or pass,
    what was wrong and what would be valid."""
