"""dsseq: Ulysses sequence parallelism, as DeepSpeed provides it.

    attn = dsseq.DistributedAttention(local_attention, groups.sequence)   # deepspeed.sequence.layer
    out = attn(q, k, v, batch_dim_idx=1)                                   # each rank: its slice of the sequence

    mpu = dsseq.UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", sequence_parallel_size=2,
                                                                 micro_batch_size=1)
    loader = dsseq.UlyssesSPDataLoaderAdapter(loader, sp_rank, sp_group, sp_world_size, device)

    dsseq.TiledMLP, dsseq.TiledFusedLogitsLoss, dsseq.SequenceTiledCompute   # flat activation memory
"""

from . import ops  # registers torch.ops.dsseq.* (AutoSP's graph operators)
from ._version import __version__
from .comm import all_to_all, gather_sequence, sum_over_ranks
from .dataloader import UlyssesSPDataLoaderAdapter, shard_batch
from .errors import SequenceParallelError
from .heads import HeadSplit, split_heads
from .layer import DistributedAttention, apply_rotary
from .loss import sequence_parallel_loss, shard_sequence, shift_labels
from .memory import TensorMemory
from .tiled import SequenceTiledCompute, TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute
from .ulysses_hf import UlyssesSPAttentionHF, restore_transformers_attention

__all__ = [
    "DistributedAttention",
    "HeadSplit",
    "SequenceParallelError",
    "SequenceTiledCompute",
    "TensorMemory",
    "TiledFusedLogitsLoss",
    "TiledMLP",
    "UlyssesSPAttentionHF",
    "UlyssesSPDataLoaderAdapter",
    "__version__",
    "all_to_all",
    "apply_rotary",
    "gather_sequence",
    "ops",
    "restore_transformers_attention",
    "sequence_parallel_loss",
    "sequence_tiled_compute",
    "shard_batch",
    "shard_sequence",
    "shift_labels",
    "split_heads",
    "sum_over_ranks",
]
