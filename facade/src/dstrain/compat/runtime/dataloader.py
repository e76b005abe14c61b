"""`deepspeed.runtime.dataloader`: the engine's loaders."""

from ...engine.dataloader import DeepSpeedDataLoader, RepeatingLoader

__all__ = ["DeepSpeedDataLoader", "RepeatingLoader"]
