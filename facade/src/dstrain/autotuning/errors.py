"""The autotuner's error: a session that cannot start or finish as asked (config problems are dsconfig's
ConfigError, naming the key)."""

from ..errors import DstrainError


class AutotuningError(DstrainError):
    """The tuning session cannot go on: what is wrong, where, and what to do instead."""
