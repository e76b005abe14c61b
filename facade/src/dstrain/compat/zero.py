"""`dstrain.zero`: DeepSpeed's `deepspeed.zero` names, from dszero."""

from dszero import GatheredParameters, Init, register_external_parameter, unregister_external_parameter

__all__ = ["GatheredParameters", "Init", "register_external_parameter", "unregister_external_parameter"]
