"""The token work of random-LTD in plain torch index ops (CPU and GPU alike; no compiled kernel):
draw each sample's kept tokens, gather them, scatter the layer's output back, and cut the attention
mask to the kept tokens.

Hidden states are [batch, seq, hidden] (batch_first) or [seq, batch, hidden]. Gather and scatter work
on the flattened [batch*seq, hidden] rows with index_select / index_copy, whose backward passes are
index_add / index_fill: autograd differentiates them exactly, and rows not kept are copied untouched.
"""

from __future__ import annotations

import torch


def sample_token_indices(reserved_length: int, seq_length: int, batch_size: int, layers: int,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """[layers, batch, reserved] positions: for each layer and sample a uniformly random subset of
    `reserved_length` of the `seq_length` tokens, ascending (drawn from torch's generator on `device`,
    so activation checkpointing's RNG replay draws the same subset again)."""
    scores = torch.rand(layers * batch_size, seq_length, device=device)
    kept = scores.topk(reserved_length, dim=1, sorted=False).indices.sort(dim=1).values
    return kept.reshape(layers, batch_size, reserved_length)


def _rows(indices: torch.Tensor, seq_length: int, batch_size: int, batch_first: bool) -> torch.Tensor:
    """Row numbers in the flattened hidden states of `indices` [batch, reserved], ordered as the gathered
    part's rows: [batch, reserved] when batch_first, [reserved, batch] otherwise."""
    batch = torch.arange(batch_size, device=indices.device).unsqueeze(1)
    if batch_first:
        return (indices + batch * seq_length).reshape(-1)
    return (indices * batch_size + batch).t().reshape(-1)


def gather_tokens(hidden_states: torch.Tensor, indices: torch.Tensor, batch_first: bool) -> torch.Tensor:
    """The kept tokens `indices` [batch, reserved] of `hidden_states`, in the same layout with seq -> reserved."""
    seq, batch = (hidden_states.shape[1], hidden_states.shape[0]) if batch_first else hidden_states.shape[:2]
    rows = _rows(indices, seq, batch, batch_first)
    flat = hidden_states.reshape(seq * batch, -1).index_select(0, rows)
    reserved = indices.shape[1]
    shape = (batch, reserved) if batch_first else (reserved, batch)
    return flat.reshape(*shape, *hidden_states.shape[2:])


def scatter_tokens(hidden_states: torch.Tensor, part: torch.Tensor, indices: torch.Tensor,
                   batch_first: bool) -> torch.Tensor:
    """`hidden_states` with the kept tokens replaced by `part` (the layer's output on them); the other tokens
    are the input's, bit for bit."""
    seq, batch = (hidden_states.shape[1], hidden_states.shape[0]) if batch_first else hidden_states.shape[:2]
    rows = _rows(indices, seq, batch, batch_first)
    flat = hidden_states.reshape(seq * batch, -1)
    merged = flat.index_copy(0, rows, part.reshape(rows.numel(), -1).to(flat.dtype))
    return merged.reshape(hidden_states.shape)


def slice_decoder_mask(mask: torch.Tensor, reserved_length: int) -> torch.Tensor:
    """A causal mask [..., seq, seq] for the kept tokens: kept tokens stay in order, so the causal mask
    among them is the leading [reserved, reserved] block (DeepSpeed's slice)."""
    return mask[..., :reserved_length, :reserved_length]


def gather_encoder_mask(mask: torch.Tensor, indices: torch.Tensor, seq_length: int) -> torch.Tensor:
    """An encoder mask [batch, ..., seq | 1, seq] restricted to each sample's kept tokens `indices`
    [batch, reserved] along each of its last two dimensions that spans the sequence (a mask shared by the
    batch, batch dimension 1, is first repeated per sample)."""
    batch, reserved = indices.shape
    out = mask if mask.shape[0] == batch else mask.expand(batch, *mask.shape[1:])
    for dim in (out.dim() - 2, out.dim() - 1):
        if dim >= 1 and out.shape[dim] == seq_length:
            view = [batch] + [1] * (out.dim() - 1)
            view[dim] = reserved
            target = list(out.shape)
            target[dim] = reserved
            out = out.gather(dim, indices.reshape(view).expand(target))
    return out
