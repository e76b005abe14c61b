"""The optimizers dstrain builds itself for the config's `optimizer.type`: Lamb and Muon."""

from .lamb import Lamb
from .muon import Muon, muon_update

FusedLamb = Lamb  # DeepSpeed's class name (deepspeed.ops.lamb.FusedLamb)

__all__ = ["FusedLamb", "Lamb", "Muon", "muon_update"]
