"""`deepspeed.sequence`: Ulysses sequence parallelism (dsseq) under DeepSpeed's module path.

    from dstrain.sequence.layer import DistributedAttention     # deepspeed.sequence.layer
"""

from ...wiring.optional_libs import require

try:  # dsseq is an optional library: name its install, not a stack
    import dsseq  # noqa: F401
except ModuleNotFoundError:
    require("dsseq", "dstrain.sequence (Ulysses sequence parallelism)")
    raise

from . import layer

__all__ = ["layer"]
