"""`deepspeed.monitor.tensorboard`: dsmonitor's TensorBoardMonitor."""

from dsmonitor import TensorBoardMonitor

__all__ = ["TensorBoardMonitor"]
