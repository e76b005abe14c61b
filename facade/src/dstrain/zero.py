"""`dstrain.zero`: DeepSpeed's `deepspeed.zero` names, from dszero."""

from dszero import GatheredParameters

__all__ = ["GatheredParameters"]

try:  # dszero.Init arrives with parameter partitioning at construction
    from dszero import Init  # noqa: F401

    __all__.append("Init")
except ImportError:
    pass
