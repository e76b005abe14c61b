"""`deepspeed.monitor.csv_monitor`: dsmonitor's CSV monitor (`csvMonitor`, DeepSpeed's spelling, is CSVMonitor)."""

from dsmonitor import CSVMonitor, csvMonitor

__all__ = ["CSVMonitor", "csvMonitor"]
