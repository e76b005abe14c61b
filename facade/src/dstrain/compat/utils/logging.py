"""`deepspeed.utils.logging`: the engine's logger and DeepSpeed's level helpers, on dstrain's logger (logs.py)."""

from __future__ import annotations

from typing import Any

from ...logs import LOG_LEVELS as log_levels
from ...logs import log_level_from_string as get_log_level_from_string
from ...logs import logger, set_log_level
from . import log_dist


def set_log_level_from_string(log_level_str: str, custom_logger: Any = None) -> None:
    set_log_level(log_level_str, custom_logger)


__all__ = ["get_log_level_from_string", "log_dist", "log_levels", "logger", "set_log_level_from_string"]
