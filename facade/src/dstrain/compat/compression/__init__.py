"""`deepspeed.compression`: the paths of DeepSpeed's compression package that applications import for its
helpers (DeepSpeed-Chat's LoRA takes `recursive_getattr` / `recursive_setattr` from `helper`). Compression
training itself (`init_compression`, the `compression_training` config section) is not provided: a config
that turns it on is refused by the feature gate, naming the key."""

from .helper import recursive_getattr, recursive_setattr

__all__ = ["recursive_getattr", "recursive_setattr"]
