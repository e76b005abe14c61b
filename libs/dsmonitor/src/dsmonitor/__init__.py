"""dsmonitor: DeepSpeed's monitors, timers and flops profiler, usable from any training loop.

    with dsmonitor.MonitorMaster(tensorboard=cfg.tensorboard, csv_monitor=cfg.csv_monitor) as monitor:
        monitor.write_events([(dsmonitor.events.LR, lr, samples)])

`import dsmonitor` imports neither torch nor any backend package: wandb, comet_ml and tensorboard
load when their monitor is built, torch when the profiler is used.
"""

from . import events
from ._version import __version__
from .backends import Backend, CometMonitor, CSVMonitor, TensorBoardMonitor, WandbMonitor, csvMonitor
from .errors import MissingExtraError, MonitorConfigError, MonitorError
from .master import MonitorMaster
from .memory import see_memory_usage
from .timers import SynchronizedWallClockTimer, ThroughputTimer

_LAZY = {  # name -> module: these import torch, so they load on first use
    "FlopsProfiler": "profiler",
    "get_model_profile": "profiler",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dsmonitor' has no attribute {name!r}")


__all__ = [
    "Backend",
    "CSVMonitor",
    "CometMonitor",
    "FlopsProfiler",
    "MissingExtraError",
    "MonitorConfigError",
    "MonitorError",
    "MonitorMaster",
    "SynchronizedWallClockTimer",
    "TensorBoardMonitor",
    "ThroughputTimer",
    "WandbMonitor",
    "__version__",
    "csvMonitor",
    "events",
    "get_model_profile",
    "see_memory_usage",
]
