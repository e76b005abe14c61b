"""`deepspeed.sequence.layer`: DistributedAttention, Ulysses around any local attention (dsseq)."""

from dsseq import DistributedAttention
from dsseq import apply_rotary as apply_rotary_pos_emb

__all__ = ["DistributedAttention", "apply_rotary_pos_emb"]
