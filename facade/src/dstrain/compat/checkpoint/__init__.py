"""`deepspeed.checkpoint`: the DeepSpeed checkpoint package's paths that integrations import. Today its `utils`
(`clone_tensors_for_torch_save`, which Accelerate calls to save a model trained at ZeRO stages 0-2). dstrain's
own checkpoint code is `dstrain.checkpoint` (what save_checkpoint / load_checkpoint write and read)."""

from .utils import clone_tensors_for_torch_save

__all__ = ["clone_tensors_for_torch_save"]
