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
"""

import importlib

from ._version import __version__

_LAZY = {  # public name -> (module, attribute); attribute None means the module itself
    "initialize": ("initialize", "initialize"),
    "tp_model_init": ("wiring_dstp", "tp_model_init"),
    "add_config_arguments": ("arguments", "add_config_arguments"),
    "init_distributed": ("comm", "init_distributed"),
    "DeepSpeedEngine": ("engine", "DeepSpeedEngine"),
    "PipelineEngine": ("pipe_engine", "PipelineEngine"),
    "PipelineModule": ("pipe", "PipelineModule"),
    "pipe": ("pipe", None),
    "DeepSpeedDataLoader": ("dataloader", "DeepSpeedDataLoader"),
    "RepeatingLoader": ("dataloader", "RepeatingLoader"),
    "CheckpointLoadError": ("errors", "CheckpointLoadError"),
    "ConfigError": ("errors", "ConfigError"),
    "DeepSpeedConfigError": ("errors", "ConfigError"),
    "DstrainError": ("errors", "DstrainError"),
    "UnsupportedFeatureError": ("errors", "UnsupportedFeatureError"),
    "checkpointing": ("checkpointing", None),
    "comm": ("comm", None),
    "zero": ("zero", None),
    "moe": ("moe", None),
    "ops": ("ops", None),
    "lr_schedules": ("lr_schedules", None),
    "accelerator": ("accelerator", None),
    "utils": ("utils", None),
    "runtime": ("runtime", None),
    "DeepSpeedConfig": ("runtime.config", "DeepSpeedConfig"),
    "log_dist": ("utils", "log_dist"),
    "DeepSpeedTransformerLayer": ("ops.transformer", "DeepSpeedTransformerLayer"),
    "DeepSpeedTransformerConfig": ("ops.transformer", "DeepSpeedTransformerConfig"),
    "convert_to_random_ltd": ("wiring_dsdata", "convert_to_random_ltd"),
    "remove_random_ltd_state_dict": ("wiring_dsdata", "remove_random_ltd_state_dict"),
    "save_without_random_ltd": ("wiring_dsdata", "save_without_random_ltd"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'dstrain' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["__version__", *_LAZY]
