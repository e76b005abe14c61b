"""`deepspeed.monitor.comet`: dsmonitor's CometMonitor."""

from dsmonitor import CometMonitor

__all__ = ["CometMonitor"]
