"""`dstrain.zero`: DeepSpeed's `deepspeed.zero` names, from dszero."""

from dszero import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]
