"""`deepspeed.runtime.zero`: ZeRO's public names, from dszero."""

from dszero import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]
