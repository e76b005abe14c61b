"""The optimizers dstrain builds itself for the config's `optimizer.type` (Lamb and Muon), and DeepSpeed's
transformer kernel layer (dstrain.ops.transformer)."""

from . import op_builder, transformer
from .lamb import Lamb
from .muon import Muon, muon_update
from .transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

FusedLamb = Lamb  # DeepSpeed's class name (deepspeed.ops.lamb.FusedLamb)

# DeepSpeed's table of which ops work here, read by scripts and tests before they use one (op_builder's NAME).
__compatible_ops__ = op_builder.compatible_ops()

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "FusedLamb", "Lamb", "Muon", "muon_update",
           "op_builder", "transformer"]
