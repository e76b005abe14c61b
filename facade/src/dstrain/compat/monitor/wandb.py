"""`deepspeed.monitor.wandb`: dsmonitor's WandbMonitor."""

from dsmonitor import WandbMonitor

__all__ = ["WandbMonitor"]
