"""`deepspeed.runtime.dataloader`: the engine's loaders."""

from ..dataloader import DeepSpeedDataLoader, RepeatingLoader

__all__ = ["DeepSpeedDataLoader", "RepeatingLoader"]
