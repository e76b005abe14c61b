"""`deepspeed.checkpoint`: the DeepSpeed checkpoint package's names that conversion scripts and integrations
import. The constants naming DeepSpeed's files and keys (`constants`, also at the top level), the inspectors
`DeepSpeedCheckpoint` / `ZeROCheckpoint` and the reshape arithmetic `model_3d_desc` / `get_model_3d_descriptor`
(dstrain.checkpoint.deepspeed: DeepSpeed's files read through the restricted unpickler), `utils`
(`clone_tensors_for_torch_save`, which Accelerate calls, and the file-name helpers), and `ds_to_universal`
(dstrain's converter, loaded on first use). dstrain's own checkpoint code is `dstrain.checkpoint` (what
save_checkpoint / load_checkpoint write and read)."""

from ...checkpoint.deepspeed.constants import *  # noqa: F403 - DeepSpeed's package exports its constants so
from ...checkpoint.deepspeed.inspect import DeepSpeedCheckpoint, ZeROCheckpoint
from ...checkpoint.deepspeed.topology import Model3DDescriptor, get_model_3d_descriptor
from ..lazy import submodule_attributes
from . import constants
from .utils import (
    clone_tensors_for_torch_save,
    get_layer_ckpt_name_for_rank,
    get_model_ckpt_name_for_rank,
    get_zero_ckpt_name_for_rank,
)

model_3d_desc = Model3DDescriptor  # DeepSpeed's class name

__getattr__ = submodule_attributes(__name__, {"ds_to_universal": "dstrain.checkpoint.ds_to_universal"},
                                   "deepspeed.checkpoint")

__all__ = ["DeepSpeedCheckpoint", "ZeROCheckpoint", "clone_tensors_for_torch_save", "constants",
           "get_layer_ckpt_name_for_rank", "get_model_3d_descriptor", "get_model_ckpt_name_for_rank",
           "get_zero_ckpt_name_for_rank", "model_3d_desc"]
