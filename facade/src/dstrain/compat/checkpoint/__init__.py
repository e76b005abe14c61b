"""`deepspeed.checkpoint`: the DeepSpeed checkpoint package's paths that integrations import. Its `utils`
(`clone_tensors_for_torch_save`, which Accelerate calls to save a model trained at ZeRO stages 0-2), and
`ds_to_universal` (mapped to `dstrain.checkpoint.ds_to_universal`). dstrain's own checkpoint code is
`dstrain.checkpoint` (what save_checkpoint / load_checkpoint write and read)."""

from .utils import clone_tensors_for_torch_save

__all__ = ["clone_tensors_for_torch_save"]
