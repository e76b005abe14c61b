"""`deepspeed.monitor.monitor`: dsmonitor's MonitorMaster (DeepSpeed's `Monitor` base is dsmonitor's Backend protocol)."""

from dsmonitor import Backend as Monitor
from dsmonitor import MonitorMaster

__all__ = ["Monitor", "MonitorMaster"]
