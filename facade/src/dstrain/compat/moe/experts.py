"""`deepspeed.moe.experts`: a rank's experts (dsmoe's, named by global expert id)."""

from dsmoe.experts import Experts

__all__ = ["Experts"]
