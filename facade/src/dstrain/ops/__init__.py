"""The optimizers dstrain builds itself for the config's `optimizer.type` (Lamb and Muon), and DeepSpeed's
transformer kernel layer (dstrain.ops.transformer)."""

from . import transformer
from .lamb import Lamb
from .muon import Muon, muon_update
from .transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

FusedLamb = Lamb  # DeepSpeed's class name (deepspeed.ops.lamb.FusedLamb)

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "FusedLamb", "Lamb", "Muon", "muon_update",
           "transformer"]
