"""`deepspeed.runtime.sequence_parallel.ulysses_sp`: Ulysses for Hugging Face models and the tiled compute
that keeps activation memory flat at long lengths (dsseq)."""

from dsseq import (
    SequenceTiledCompute,
    TiledFusedLogitsLoss,
    TiledMLP,
    UlyssesSPAttentionHF,
    UlyssesSPDataLoaderAdapter,
    sequence_tiled_compute,
)

__all__ = ["SequenceTiledCompute", "TiledFusedLogitsLoss", "TiledMLP", "UlyssesSPAttentionHF",
           "UlyssesSPDataLoaderAdapter", "sequence_tiled_compute"]
