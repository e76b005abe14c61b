"""`dstrain.runtime`: DeepSpeed's `deepspeed.runtime` module paths that training scripts import from
(`runtime.utils`, `runtime.lr_schedules`, `runtime.config`, `runtime.dataloader`, `runtime.zero`, ...).
Each submodule re-exports what dstrain provides under DeepSpeed's name; it holds no logic of its own.
They are attributes too (loaded on first use), as in DeepSpeed: `deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES`."""

from ..lazy import submodule_attributes

__getattr__ = submodule_attributes(__name__, {
    "config": ".config", "constants": ".constants", "dataloader": ".dataloader", "lr_schedules": ".lr_schedules", "utils": ".utils",
    "zero": ".zero", "domino": ".domino", "engine": "dstrain.engine", "fp16": ".fp16",
    "bf16_optimizer": ".bf16_optimizer", "precision_config": ".precision_config",
    "tensor_parallel": ".tensor_parallel",
    # deepspeed.runtime.activation_checkpointing is served by this package: its `checkpointing` submodule
    "checkpointing": "dstrain.checkpointing",
}, "deepspeed.runtime")
