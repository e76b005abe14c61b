"""The loss of a sharded sequence: pre-shifted labels, slicing, and the mean over every rank's tokens.

A causal LM predicts token i+1 at position i. Shifting after sharding would lose the label at every
shard boundary (the next shard's first token), so labels are shifted once over the whole sequence
(`shift_labels`) and then sharded with the inputs. The loss of the whole sequence is the sum of every
rank's token losses over the count of every rank's valid labels (`sequence_parallel_loss`), the same
number Hugging Face's mean cross-entropy gives on one rank.
"""

from __future__ import annotations

from typing import Any

import torch

import dscomm

from .comm import group_size, sum_over_ranks
from .errors import SequenceParallelError

IGNORE_INDEX = -100


def shift_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX, seq_dim: int = 1) -> torch.Tensor:
    """labels[..., i + 1] at position i, `ignore_index` at the last position (before any sharding)."""
    seq_dim %= labels.dim()
    pad = torch.full_like(labels.narrow(seq_dim, 0, 1), ignore_index)
    return torch.cat((labels.narrow(seq_dim, 1, labels.shape[seq_dim] - 1), pad), dim=seq_dim)


def shard_sequence(tensor: torch.Tensor, rank: int, sp: int, seq_dim: int = 1, name: str = "tensor") -> torch.Tensor:
    """Rank `rank`'s contiguous slice of `tensor`'s sequence (dimension `seq_dim`) over `sp` ranks."""
    if not torch.is_tensor(tensor) or tensor.dim() <= seq_dim % max(tensor.dim(), 1):
        shape = tuple(tensor.shape) if torch.is_tensor(tensor) else type(tensor).__name__
        raise SequenceParallelError(f"{name} of shape {shape} has no sequence dimension {seq_dim}")
    length = tensor.shape[seq_dim]
    if length % sp:
        lower = length // sp * sp
        raise SequenceParallelError(f"{name}: sequence length {length} (dimension {seq_dim} of shape "
                                    f"{tuple(tensor.shape)}) is not divisible by the sequence-parallel size {sp}; "
                                    f"pad or cut it to a multiple of {sp} (e.g. {lower or sp} or {lower + sp})")
    chunk = length // sp
    return tensor.narrow(seq_dim, rank * chunk, chunk)


def sequence_parallel_loss(logits: torch.Tensor, shifted_labels: torch.Tensor, group: Any,
                           ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The mean cross-entropy of the whole sequence, on every rank of `group`, from this rank's `logits`
    ([batch, seq/sp, vocab]) and its slice of the pre-shifted labels. Differentiable (see
    comm.sum_over_ranks for how the gradient is shared)."""
    if logits.shape[:-1] != shifted_labels.shape:
        raise SequenceParallelError(f"sequence_parallel_loss: logits {tuple(logits.shape)} and labels "
                                    f"{tuple(shifted_labels.shape)} differ in batch or sequence length")
    # Half-precision logits are upcast as Hugging Face's loss does; float64 stays float64.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    token_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                  shifted_labels.reshape(-1), ignore_index=ignore_index,
                                                  reduction="sum")
    count = (shifted_labels != ignore_index).sum().to(token_sum.dtype)
    if group_size(group) > 1:
        dscomm.all_reduce(count, group=group, log_name="ulysses_label_count")
    return sum_over_ranks(token_sum, group) / count.clamp(min=1)
