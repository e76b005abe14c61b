"""`deepspeed.checkpoint`: the DeepSpeed checkpoint package's paths that integrations import. Its `utils`
(`clone_tensors_for_torch_save`, which Accelerate calls to save a model trained at ZeRO stages 0-2), and
`ds_to_universal` (dstrain's converter, `dstrain.checkpoint.ds_to_universal`, an attribute loaded on first use so
`from deepspeed.checkpoint import ds_to_universal` works). dstrain's own checkpoint code is `dstrain.checkpoint`
(what save_checkpoint / load_checkpoint write and read)."""

from ..lazy import submodule_attributes
from .utils import clone_tensors_for_torch_save

__getattr__ = submodule_attributes(__name__, {"ds_to_universal": "dstrain.checkpoint.ds_to_universal"},
                                   "deepspeed.checkpoint")

__all__ = ["clone_tensors_for_torch_save"]
