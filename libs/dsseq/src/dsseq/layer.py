"""`DistributedAttention`: Ulysses around any local attention (DeepSpeed's `deepspeed.sequence.layer`).

Each rank holds a slice of the sequence of q, k and v with every head. One all-to-all per tensor gives
each rank the whole sequence of its share of the heads; the local attention runs on that (any function:
SDPA, flash attention, a Hugging Face attention function behind a small adapter); one all-to-all gives
back this rank's slice of the sequence with every head. Grouped-query attention splits by key/value
groups (heads.py); head counts that cannot split are refused with the numbers.

    attn = DistributedAttention(local_attention, groups.sequence)        # scatter heads (2), gather seq (0)
    out = attn(q, k, v, batch_dim_idx=1)                                 # q: [s/p, b, h, d] -> out [s/p, b, h, d]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .comm import all_to_all, group_size
from .errors import SequenceParallelError
from .heads import split_heads


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on the first cos.shape[-1] channels of `t` (the rest pass through)."""
    width = cos.shape[-1]
    rotated = t[..., :width] * cos + rotate_half(t[..., :width]) * sin
    return rotated if width == t.shape[-1] else torch.cat((rotated, t[..., width:]), dim=-1)


class DistributedAttention(torch.nn.Module):
    """Ulysses sequence parallelism around `local_attention` over `sequence_process_group`.

    `scatter_idx`: the head dimension of q, k, v (split over the ranks before attention);
    `gather_idx`: their sequence dimension (joined before attention). The defaults fit the
    [seq, batch, heads, dim] layout (batch_dim_idx=1); for [batch, seq, heads, dim] (batch_dim_idx=0)
    pass gather_idx=1, as Megatron-DeepSpeed does. `sp_stream` (DeepSpeed's CUDA-stream overlap of the
    all-to-alls) is not provided: leave it None.
    """

    def __init__(self, local_attention: Callable[..., Any], sequence_process_group: Any, scatter_idx: int = 2,
                 gather_idx: int = 0, sp_stream: Any = None) -> None:
        super().__init__()
        if not callable(local_attention):
            raise SequenceParallelError(f"DistributedAttention(local_attention=...) must be callable (a module or "
                                        f"function taking q, k, v), got {type(local_attention).__name__}")
        if sp_stream is not None:
            raise SequenceParallelError("DistributedAttention(sp_stream=...): overlapping the all-to-alls on a CUDA "
                                        "stream is not provided; leave sp_stream None (the all-to-alls run in order)")
        for name, value in (("scatter_idx", scatter_idx), ("gather_idx", gather_idx)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise SequenceParallelError(f"DistributedAttention({name}={value!r}) must be a dimension index")
        if scatter_idx == gather_idx:
            raise SequenceParallelError(f"DistributedAttention: scatter_idx and gather_idx are both {scatter_idx}; "
                                        f"scatter_idx is the head dimension, gather_idx the sequence dimension")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, batch_dim_idx: int,
                rotary_pos_emb: tuple[torch.Tensor, torch.Tensor] | None = None, *args: Any, **kwargs: Any) -> Any:
        """The local attention's output for this rank's slice of the sequence, every head.

        `rotary_pos_emb`: (cos, sin) of the whole sequence in [batch, seq, 1, dim] (DeepSpeed's layout),
        applied to q and k after the all-to-all, where each rank holds the whole sequence. `args` and
        `kwargs` go to the local attention. A tuple output (an attention function's (out, weights)) comes
        back with its first element exchanged and the rest as they are.
        """
        if batch_dim_idx not in (0, 1):
            raise SequenceParallelError(f"DistributedAttention.forward(batch_dim_idx={batch_dim_idx!r}): 0 for "
                                        f"[batch, seq, ...] inputs, 1 for [seq, batch, ...]")
        sp = group_size(self.spg)
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if not torch.is_tensor(tensor) or tensor.dim() <= max(self.scatter_idx, self.gather_idx, batch_dim_idx):
                shape = tuple(tensor.shape) if torch.is_tensor(tensor) else type(tensor).__name__
                raise SequenceParallelError(f"DistributedAttention: {name} of shape {shape} has no dimension "
                                            f"{max(self.scatter_idx, self.gather_idx)} (scatter_idx "
                                            f"{self.scatter_idx}, gather_idx {self.gather_idx})")
        if key.shape != value.shape:
            raise SequenceParallelError(f"DistributedAttention: key {tuple(key.shape)} and value "
                                        f"{tuple(value.shape)} differ in shape")
        heads = split_heads(query.shape[self.scatter_idx], key.shape[self.scatter_idx], sp, "DistributedAttention")
        if heads.kv_repeat > 1:  # fewer key/value heads than ranks: each rank gets the one its queries read
            key = key.repeat_interleave(heads.kv_repeat, dim=self.scatter_idx)
            value = value.repeat_interleave(heads.kv_repeat, dim=self.scatter_idx)
        q, k, v = (all_to_all(t, self.scatter_idx, self.gather_idx, self.spg) for t in (query, key, value))
        if rotary_pos_emb is not None:
            cos, sin = rotary_pos_emb
            if batch_dim_idx == 1:  # [b, s, 1, d] -> the seq-first layout of q and k
                cos, sin = cos.transpose(0, 1), sin.transpose(0, 1)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        output = self.local_attn(q, k, v, *args, **kwargs)
        rest: tuple[Any, ...] = ()
        if isinstance(output, tuple):
            output, rest = output[0], output[1:]
        if not torch.is_tensor(output) or output.dim() <= max(self.scatter_idx, self.gather_idx):
            raise SequenceParallelError(
                f"DistributedAttention: the local attention returned "
                f"{tuple(output.shape) if torch.is_tensor(output) else type(output).__name__}; it must return a "
                f"tensor in its inputs' layout (heads at dimension {self.scatter_idx}, or heads merged into the last "
                f"dimension) with the whole sequence at dimension {self.gather_idx}")
        # Back: split the sequence, join the heads (or the merged head channels of a 3-D output).
        head_dim = self.scatter_idx if output.dim() == query.dim() else output.dim() - 1
        output = all_to_all(output, self.gather_idx, head_dim, self.spg)
        return (output, *rest) if rest else output
