"""dstrain: DeepSpeed's training API on small libraries. `import dstrain as deepspeed` and run.

    engine, optimizer, loader, scheduler = dstrain.initialize(model=model, config="ds_config.json",
                                                              model_parameters=model.parameters(),
                                                              training_data=dataset)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

Names load on first use, so the `dstrain` launcher and `dstrain-report` start without importing
torch or the engine.

Where things live: `engine/` (the engines and the parts they train with), `wiring/` (config to wired
objects: layout, feature gate, one module per library, compose), `checkpoint/` (what checkpoints
write and read), `compat/` (DeepSpeed's module paths: `dstrain.zero`, `dstrain.comm`, `dstrain.pipe`,
`dstrain.moe`, `dstrain.runtime`, `dstrain.utils`, ... are its modules, by the table in
compat/alias.py), `launcher/`, `autotuning/`, `ops/` (optimizers and kernels), `accelerator/`.
"""

import importlib
import sys

from ._version import (
    __git_branch__,
    __git_hash__,
    __version__,
    __version_major__,
    __version_minor__,
    __version_patch__,
)
from .compat.alias import public_paths_finder

if not any(getattr(finder, "root", None) == "dstrain" for finder in sys.meta_path):
    # First, so `dstrain.moe.layer` is compat's module, never a second copy found by path under dstrain.moe.
    sys.meta_path.insert(0, public_paths_finder())

_LAZY = {  # public name -> (module, attribute); attribute None means the module itself
    "initialize": ("initialize", "initialize"),
    "tp_model_init": ("wiring.dstp", "tp_model_init"),
    "add_config_arguments": ("arguments", "add_config_arguments"),
    "init_distributed": ("compat.comm", "init_distributed"),
    "DeepSpeedEngine": ("engine.deepspeed_engine", "DeepSpeedEngine"),
    "PipelineEngine": ("engine.pipeline_engine", "PipelineEngine"),
    "PipelineModule": ("compat.pipe", "PipelineModule"),
    "pipe": ("compat.pipe", None),
    "DeepSpeedDataLoader": ("engine.dataloader", "DeepSpeedDataLoader"),
    "RepeatingLoader": ("engine.dataloader", "RepeatingLoader"),
    "CheckpointLoadError": ("errors", "CheckpointLoadError"),
    "ConfigError": ("errors", "ConfigError"),
    "DeepSpeedConfigError": ("errors", "ConfigError"),
    "DstrainError": ("errors", "DstrainError"),
    "UnsupportedFeatureError": ("errors", "UnsupportedFeatureError"),
    "checkpointing": ("compat.checkpointing", None),
    "comm": ("compat.comm", None),
    "zero": ("compat.zero", None),
    "moe": ("compat.moe", None),
    "ops": ("ops", None),
    "lr_schedules": ("engine.lr_schedules", None),
    "accelerator": ("accelerator", None),
    "get_accelerator": ("accelerator", "get_accelerator"),
    "utils": ("compat.utils", None),
    "runtime": ("compat.runtime", None),
    "elasticity": ("compat.elasticity", None),
    "DeepSpeedConfig": ("compat.runtime.config", "DeepSpeedConfig"),
    "OnDevice": ("init_on_device", "OnDevice"),
    "log_dist": ("compat.utils", "log_dist"),
    "DeepSpeedTransformerLayer": ("ops.transformer", "DeepSpeedTransformerLayer"),
    "DeepSpeedTransformerConfig": ("ops.transformer", "DeepSpeedTransformerConfig"),
    "convert_to_random_ltd": ("wiring.dsdata", "convert_to_random_ltd"),
    "remove_random_ltd_state_dict": ("wiring.dsdata", "remove_random_ltd_state_dict"),
    "save_without_random_ltd": ("wiring.dsdata", "save_without_random_ltd"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        if name.startswith("__"):
            raise AttributeError(f"module 'dstrain' has no attribute {name!r}")  # a probe (copy, pickle, ...)
        from .compat.callers import missing

        # Named for whoever asked through `import deepspeed` (transformers, Accelerate, an application).
        raise AttributeError(f"module 'dstrain' has no attribute {name!r}: {missing(f'deepspeed.{name}')}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["__git_branch__", "__git_hash__", "__version__", "__version_major__", "__version_minor__",
           "__version_patch__", *_LAZY]
