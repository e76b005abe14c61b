"""One module per monitoring backend; each writes synchronously on the thread that calls it."""

from .base import Backend, Event
from .comet import CometMonitor
from .csv import CSVMonitor, csvMonitor
from .tensorboard import TensorBoardMonitor
from .wandb import WandbMonitor

__all__ = ["Backend", "CSVMonitor", "CometMonitor", "Event", "TensorBoardMonitor", "WandbMonitor", "csvMonitor"]
