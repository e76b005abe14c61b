"""Tiled compute along the sequence: activation memory of one tile, not of the whole sequence.

`TiledMLP`, `TiledFusedLogitsLoss` and `SequenceTiledCompute` (DeepSpeed's names and arguments) cut their
input into tiles and run the function on each tile under non-reentrant activation checkpointing: forward
keeps no tile's activations (only its input, a view of the whole input, and its output), and backward
recomputes one tile at a time (autograd reaches the last tile's nodes first, so each tile's recomputed
activations are freed before the next tile's are made). For the loss, no tile's logits outlive it.

The weights take their gradients through autograd's own graph: every tile's contribution to a weight is
summed by autograd before the weight's gradient is accumulated, so gradient hooks (ZeRO's reductions)
fire once per backward, and ZeRO-3's gathering of weights around each use works as for any checkpointed
layer. `compute_params` (DeepSpeed's way of telling its ZeRO which weights the tiles use) is accepted and
not needed: no weight can be missed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .errors import SequenceParallelError


def _check_shards(shards: Any, length: int, where: str) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise SequenceParallelError(f"{where}: shards must be a positive integer, got {shards!r}")
    return max(1, min(shards, length))


def _check_params(compute_params: Any, where: str) -> None:
    if compute_params is not None and not all(torch.is_tensor(p) for p in compute_params):
        raise SequenceParallelError(f"{where}: compute_params must be a list of tensors (the weights the function "
                                    f"uses) or None")


def _run_tile(fn: Callable, *args: Any) -> Any:
    """fn(*args) for one tile, its activations recomputed in backward instead of kept."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)


class TiledMLP:
    """`TiledMLP.apply(fn, self, x, shards, compute_params)`: fn(self, x) (a position-wise function: an MLP)
    over `shards` tiles of x's second-to-last dimension (x: [batch, seq, hidden] or [tokens, hidden])."""

    @staticmethod
    def apply(fn: Callable, self: Any, x: torch.Tensor, shards: int, compute_params: Sequence[Any] | None = None):
        if not torch.is_tensor(x) or x.dim() < 2:
            raise SequenceParallelError(f"TiledMLP: x must be [batch, seq, hidden] or [tokens, hidden], got "
                                        f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        shards = _check_shards(shards, x.shape[-2], "TiledMLP")
        _check_params(compute_params, "TiledMLP")
        return torch.cat([_run_tile(fn, self, tile) for tile in x.chunk(shards, dim=-2)], dim=-2)


class TiledFusedLogitsLoss:
    """`TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params, output_reduction)`: the loss
    fn(self, x_tile, y_tile[, mask_tile]) (e.g. lm_head then cross-entropy, one value per tile) over `shards`
    tiles of the [batch * seq] positions (x: [batch, seq, hidden], y and mask: [batch, seq]), reduced by
    "mean" (of the tiles' losses) or "sum"."""

    @staticmethod
    def apply(fn: Callable, self: Any, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None, shards: int,
              compute_params: Sequence[Any] | None = None, output_reduction: str = "mean"):
        if output_reduction not in ("mean", "sum"):
            raise SequenceParallelError(f"TiledFusedLogitsLoss: output_reduction {output_reduction!r}; valid: "
                                        f"'mean', 'sum'")
        for name, tensor in (("x", x), ("y", y)):
            if not torch.is_tensor(tensor) or tensor.dim() < 2:
                raise SequenceParallelError(f"TiledFusedLogitsLoss: {name} must be at least [batch, seq], got "
                                            f"{tuple(tensor.shape) if torch.is_tensor(tensor) else tensor!r}")
        if x.shape[:2] != y.shape[:2]:
            raise SequenceParallelError(f"TiledFusedLogitsLoss: x {tuple(x.shape)} and y {tuple(y.shape)} differ in "
                                        f"batch or sequence length")
        if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
            raise SequenceParallelError(f"TiledFusedLogitsLoss: mask {tuple(mask.shape)} must be [batch, seq] = "
                                        f"{tuple(x.shape[:2])}")
        shards = _check_shards(shards, x.shape[0] * x.shape[1], "TiledFusedLogitsLoss")
        _check_params(compute_params, "TiledFusedLogitsLoss")
        rows = x.reshape(-1, *x.shape[2:]).chunk(shards)
        targets = y.reshape(-1, *y.shape[2:]).chunk(shards)
        masks = mask.reshape(-1).chunk(shards) if mask is not None else [None] * len(rows)
        losses = []
        for tile, target, tile_mask in zip(rows, targets, masks):
            loss = _run_tile(fn, self, tile, target, *(() if tile_mask is None else (tile_mask,)))
            if not torch.is_tensor(loss) or loss.numel() != 1:
                raise SequenceParallelError(f"TiledFusedLogitsLoss: fn returned "
                                            f"{tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__};"
                                            f" it must return one loss value per tile")
            losses.append(loss.reshape(()))
        stacked = torch.stack(losses)
        return stacked.mean() if output_reduction == "mean" else stacked.sum()


class SequenceTiledCompute:
    """`SequenceTiledCompute.apply(fn, seqlen, shards, keys_to_shard, keys_to_pass, grad_requiring_tensor_key,
    compute_params, output_unshard_dimension, output_reduction, *args)`: DeepSpeed's positional form of
    `sequence_tiled_compute` (args: the values to shard, then those to pass, in key order)."""

    @staticmethod
    def apply(fn: Callable, seqlen: int, shards: int, keys_to_shard: Sequence[str], keys_to_pass: Sequence[str],
              grad_requiring_tensor_key: str, compute_params: Sequence[Any] | None, output_unshard_dimension: int,
              output_reduction: str | None, *args: Any):
        keys_to_shard, keys_to_pass = list(keys_to_shard), list(keys_to_pass)
        if len(args) != len(keys_to_shard) + len(keys_to_pass):
            raise SequenceParallelError(f"SequenceTiledCompute: {len(args)} values for {len(keys_to_shard)} keys to "
                                        f"shard and {len(keys_to_pass)} to pass")
        return sequence_tiled_compute(fn, seqlen, shards, dict(zip(keys_to_shard, args[:len(keys_to_shard)])),
                                      dict(zip(keys_to_pass, args[len(keys_to_shard):])), grad_requiring_tensor_key,
                                      compute_params, output_unshard_dimension, output_reduction)


def sequence_tiled_compute(fn: Callable, seqlen: int, shards: int, kwargs_to_shard: dict[str, Any],
                           kwargs_to_pass: dict[str, Any], grad_requiring_tensor_key: str,
                           compute_params: Sequence[Any] | None = None, output_unshard_dimension: int = 1,
                           output_reduction: str | None = "mean") -> torch.Tensor:
    """fn(**tiles of kwargs_to_shard, **kwargs_to_pass) over `shards` tiles of the sequence (dimension 1 of
    every [batch, seq, ...] tensor in kwargs_to_shard, tiles of ceil(seqlen / shards)), the outputs joined
    along `output_unshard_dimension` (0: one value per tile, e.g. a loss) and reduced by `output_reduction`
    (None, "mean" or "sum"). Gradients reach every input and weight that requires them."""
    where = "sequence_tiled_compute"
    if output_reduction not in (None, "mean", "sum"):
        raise SequenceParallelError(f"{where}: output_reduction {output_reduction!r}; valid: None, 'mean', 'sum'")
    if grad_requiring_tensor_key not in kwargs_to_shard:
        raise SequenceParallelError(f"{where}: grad_requiring_tensor_key {grad_requiring_tensor_key!r} is not among "
                                    f"kwargs_to_shard ({', '.join(kwargs_to_shard)})")
    for key, value in kwargs_to_shard.items():
        if not torch.is_tensor(value) or value.dim() < 2 or value.shape[1] != seqlen:
            raise SequenceParallelError(f"{where}: kwargs_to_shard[{key!r}] of shape "
                                        f"{tuple(value.shape) if torch.is_tensor(value) else type(value).__name__} "
                                        f"is not [batch, seqlen={seqlen}, ...]")
    shards = _check_shards(shards, seqlen, where)
    _check_params(compute_params, where)
    keys = list(kwargs_to_shard)

    def tile_fn(*tiles: torch.Tensor) -> Any:
        return fn(**dict(zip(keys, tiles)), **kwargs_to_pass)

    step = math.ceil(seqlen / shards)
    outputs = [_run_tile(tile_fn, *(v[:, start:start + step] for v in kwargs_to_shard.values()))
               for start in range(0, seqlen, step)]
    if output_unshard_dimension == 0:  # one value (e.g. a loss) per tile
        joined = torch.stack([o.reshape(()) if o.numel() == 1 else o for o in outputs])
    else:
        joined = torch.cat(outputs, dim=output_unshard_dimension)
    if output_reduction is None:
        return joined
    return joined.mean() if output_reduction == "mean" else joined.sum()
