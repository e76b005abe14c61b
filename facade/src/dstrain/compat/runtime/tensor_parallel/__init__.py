"""`deepspeed.runtime.tensor_parallel`: AutoTP training's reading of a model (dstp; the `tensor_parallel`
config section turns it on, see the facade README).

    from dstrain.runtime.tensor_parallel.config import _get_hf_tp_plan   # the plan a Hugging Face model carries
"""

from ....wiring.optional_libs import require

try:  # dstp is an optional library: name its install, not a stack
    import dstp  # noqa: F401
except ModuleNotFoundError:
    require("dstp", "dstrain.runtime.tensor_parallel (AutoTP tensor parallelism)")
    raise

from . import config

__all__ = ["config"]
