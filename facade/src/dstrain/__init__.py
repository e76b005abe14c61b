"""dstrain: DeepSpeed's training API on small libraries. `import dstrain as deepspeed` and run.

    engine, optimizer, loader, scheduler = dstrain.initialize(model=model, config="ds_config.json",
                                                              model_parameters=model.parameters(),
                                                              training_data=dataset)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
"""

from dscomm import init_distributed

from . import comm, zero
from ._version import __version__
from .arguments import add_config_arguments
from .dataloader import DeepSpeedDataLoader, RepeatingLoader
from .engine import DeepSpeedEngine
from .errors import CheckpointLoadError, ConfigError, DstrainError, UnsupportedFeatureError
from .initialize import initialize

DeepSpeedConfigError = ConfigError  # DeepSpeed's name

__all__ = [
    "CheckpointLoadError",
    "ConfigError",
    "DeepSpeedConfigError",
    "DeepSpeedDataLoader",
    "DeepSpeedEngine",
    "DstrainError",
    "RepeatingLoader",
    "UnsupportedFeatureError",
    "__version__",
    "add_config_arguments",
    "checkpointing",
    "comm",
    "init_distributed",
    "initialize",
    "zero",
]
