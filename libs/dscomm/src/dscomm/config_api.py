"""`configure()` and the logger's reset: how users turn communication logging on."""

from __future__ import annotations

from typing import Any

from dsconfig import CommsLoggerConfig, DeepSpeedConfig

from .logger import LOGGER


def configure(deepspeed_config: CommsLoggerConfig | DeepSpeedConfig | None = None, enabled: bool | None = None,
              prof_all: bool | None = None, prof_ops: list[str] | None = None, verbose: bool | None = None,
              debug: bool | None = None) -> None:
    """Turn the comms logger on or off: from the `comms_logger` section (or a whole config), or keywords.

    Keywords override the section. An unknown op name in prof_ops is a CommError listing the valid ones.
    """
    section = deepspeed_config.comms_logger if isinstance(deepspeed_config, DeepSpeedConfig) else deepspeed_config
    LOGGER.configure(section, enabled=enabled, prof_all=prof_all, prof_ops=prof_ops, verbose=verbose, debug=debug)


def reset_comms_log() -> None:
    """Drop every record (for example after warm-up steps)."""
    LOGGER.reset()


def comms_logger_settings() -> dict[str, Any]:
    return {"enabled": LOGGER.enabled, "verbose": LOGGER.verbose, "prof_all": LOGGER.prof_all,
            "debug": LOGGER.debug, "prof_ops": sorted(LOGGER.prof_ops)}
