"""The sequence-length curriculum by post-processing: reference functions that cut each batch to the
current difficulty, for `engine.set_data_post_process_func` (no data analysis needed: the metric is the
length itself, clustering_type single_cluster).

A post-process function is called as fn(batch, sampler_state) with the data sampler's state of that
batch, whose "current_difficulties" holds each metric's difficulty (DeepSpeed's convention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .errors import DataEfficiencyError


def truncate(tokens: torch.Tensor, seqlen: int, dim: int = 1) -> torch.Tensor:
    """The first `seqlen` positions of `tokens` along `dim` (all of them when shorter)."""
    return tokens.narrow(dim, 0, min(seqlen, tokens.shape[dim]))


def reshape(tokens: torch.Tensor, seqlen: int) -> torch.Tensor:
    """[batch, seq] tokens as rows of `seqlen` tokens: each sample cut into seq // seqlen pieces (the tail
    shorter than seqlen is dropped), so a step sees as many tokens in shorter sequences."""
    if tokens.dim() != 2:
        raise DataEfficiencyError(f"reshape expects [batch, seq] tokens, got shape {tuple(tokens.shape)}")
    batch, seq = tokens.shape
    if seqlen >= seq:
        return tokens
    pieces = seq // seqlen
    return tokens[:, :pieces * seqlen].reshape(batch * pieces, seqlen)


def _apply(batch: Any, keys: Sequence[str] | None, cut: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if torch.is_tensor(batch):
        return cut(batch)
    if isinstance(batch, dict):
        names = keys if keys is not None else [k for k, v in batch.items() if torch.is_tensor(v) and v.dim() >= 2]
        missing = [k for k in names if k not in batch]
        if missing:
            raise DataEfficiencyError(f"seqlen post-processing: the batch has no {', '.join(missing)} (keys: "
                                      f"{', '.join(map(str, batch))})")
        return {k: cut(v) if k in names else v for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(cut(v) if torch.is_tensor(v) and v.dim() >= 2 else v for v in batch)
    raise DataEfficiencyError(f"seqlen post-processing handles a tensor, a dict or a tuple of tensors, got "
                              f"{type(batch).__name__}")


def seqlen_post_process(metric: str = "seqlen", mode: str = "truncate", extra_tokens: int = 0,
                        keys: Sequence[str] | None = None) -> Callable[[Any, dict], Any]:
    """A post-process function cutting the batch's [batch, seq, ...] tensors (or the `keys` of a dict batch)
    to the curriculum metric `metric`'s current difficulty plus `extra_tokens` (1 when the labels are the
    tokens shifted by one), by "truncate" or "reshape"."""
    if mode not in ("truncate", "reshape"):
        raise DataEfficiencyError(f"seqlen_post_process(mode={mode!r}): 'truncate' or 'reshape'")

    def post_process(batch: Any, sampler_state: dict) -> Any:
        difficulties = sampler_state.get("current_difficulties") or {}
        if metric not in difficulties:
            raise DataEfficiencyError(f"seqlen post-processing: no curriculum metric {metric!r} in the sampler state "
                                      f"(metrics: {', '.join(difficulties) or 'none'}); name the metric of the "
                                      f"config's curriculum_metrics")
        seqlen = int(difficulties[metric]) + extra_tokens
        return _apply(batch, keys, (lambda t: truncate(t, seqlen)) if mode == "truncate" else
                      (lambda t: reshape(t, seqlen)))

    return post_process
