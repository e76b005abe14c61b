"""`deepspeed.monitor.config`: DeepSpeed's monitor config classes, dsconfig's sections.

    DeepSpeedMonitorConfig().tensorboard.output_path            # the defaults
    DeepSpeedMonitorConfig(tensorboard={"enabled": True})       # checked by dsconfig as in a whole config

`TensorBoardConfig`, `WandbConfig`, `CometConfig` and `CSVConfig` are dsconfig's section classes.
"""

from __future__ import annotations

from typing import Any

import attrs

import dsconfig
from dsconfig import CometConfig, CSVMonitorConfig, TensorBoardConfig, WandbConfig

CSVConfig = CSVMonitorConfig
SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet")


@attrs.frozen
class DeepSpeedMonitorConfig:
    """The four monitor sections of a DeepSpeed config; `enabled` when any of them is."""

    tensorboard: TensorBoardConfig = attrs.field(factory=TensorBoardConfig)
    wandb: WandbConfig = attrs.field(factory=WandbConfig)
    csv_monitor: CSVMonitorConfig = attrs.field(factory=CSVMonitorConfig)
    comet: CometConfig = attrs.field(factory=CometConfig)

    def __init__(self, **sections: Any):
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            raise TypeError(f"DeepSpeedMonitorConfig: unknown section(s) {unknown}; the sections are {list(SECTIONS)}")
        loaded = {name: value if attrs.has(type(value)) else dsconfig.load_section(name, value)
                  for name, value in sections.items()}
        self.__attrs_init__(**loaded)

    @classmethod
    def of(cls, config: Any) -> DeepSpeedMonitorConfig:
        """The monitor sections of a loaded dsconfig DeepSpeedConfig."""
        return cls(**{name: getattr(config, name) for name in SECTIONS})

    @property
    def enabled(self) -> bool:
        return any(getattr(self, name).enabled for name in SECTIONS)


def get_monitor_config(param_dict: dict) -> DeepSpeedMonitorConfig:
    """DeepSpeed's helper: the monitor sections of a config dict."""
    return DeepSpeedMonitorConfig(**{name: param_dict.get(name, {}) for name in SECTIONS})


__all__ = ["CSVConfig", "CometConfig", "DeepSpeedMonitorConfig", "TensorBoardConfig", "WandbConfig",
           "get_monitor_config"]
