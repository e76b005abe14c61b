"""`deepspeed.runtime.sequence_parallel`: the Hugging Face long-sequence path (ALST) of dsseq.

    from dstrain.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
"""

from ....wiring.optional_libs import require

try:  # dsseq is an optional library: name its install, not a stack
    import dsseq  # noqa: F401
except ModuleNotFoundError:
    require("dsseq", "dstrain.runtime.sequence_parallel (Ulysses sequence parallelism)")
    raise

from . import parallel_state_sp, ulysses_sp

__all__ = ["parallel_state_sp", "ulysses_sp"]
