"""Tiled compute along the sequence: activation memory of one tile, not of the whole sequence.

`TiledMLP`, `TiledFusedLogitsLoss` and `SequenceTiledCompute` (DeepSpeed's names and arguments) run a
function tile by tile without keeping its activations, and recompute each tile in backward (the loss
does its backward tile by tile inside forward, so the whole logits never exist).

Gradients of the weights are computed per tile with `torch.autograd.grad` and handed to autograd once,
as gradients of inputs of the function: each weight's gradient arrives in one piece, so gradient hooks
(ZeRO's reductions) fire once per backward, not once per tile. The weights are `compute_params`, or, when
that is None, the parameters of the module passed in. A weight the function uses that is in neither is
refused by name in backward, never silently left without its gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .errors import SequenceParallelError


def _trainable(params: Sequence[torch.Tensor] | None, *modules: Any) -> list[torch.Tensor]:
    if params is None:
        params = [p for m in modules if isinstance(m, torch.nn.Module) for p in m.parameters()]
    seen: dict[int, torch.Tensor] = {}
    for p in params:
        if not torch.is_tensor(p):
            raise SequenceParallelError(f"compute_params must hold tensors (the weights the function uses), got "
                                        f"{type(p).__name__}")
        if p.requires_grad:
            seen.setdefault(id(p), p)
    return list(seen.values())


def _check_shards(shards: Any, length: int, where: str) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise SequenceParallelError(f"{where}: shards must be a positive integer, got {shards!r}")
    return max(1, min(shards, length))


def _leaves(output: Any) -> dict[int, torch.Tensor]:
    """Every leaf tensor that requires grad in the autograd graph of `output`."""
    found: dict[int, torch.Tensor] = {}
    seen: set[Any] = set()
    stack = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            found[id(variable)] = variable
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def _tensors(output: Any) -> list[torch.Tensor]:
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    raise SequenceParallelError(f"the tiled function returned {type(output).__name__}; it must return a tensor")


def _check_covered(output: Any, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], where: str) -> None:
    known = {id(t) for t in (*inputs, *params)}
    unlisted = [t for key, t in _leaves(output).items() if key not in known]
    if unlisted:
        shapes = ", ".join(str(tuple(t.shape)) for t in unlisted[:5])
        raise SequenceParallelError(f"{where}: the function uses {len(unlisted)} trainable tensor(s) (shapes "
                                    f"{shapes}) that are neither in compute_params nor parameters of the module "
                                    f"passed in; list them in compute_params so they get their gradients")


def _grads(output: torch.Tensor, wrt: Sequence[torch.Tensor], grad_output: torch.Tensor | None) -> list[Any]:
    return list(torch.autograd.grad(output, wrt, grad_output, allow_unused=True))


def _add(total: list[Any], grads: Sequence[Any]) -> None:
    for i, g in enumerate(grads):
        if g is not None:
            total[i] = g if total[i] is None else total[i] + g


# --------------------------------------------------------------------------------------------- TiledMLP
class _TiledRows(torch.autograd.Function):
    """fn(module, x) row-tile by row-tile over x's second-to-last dimension; recomputed in backward."""

    @staticmethod
    def forward(ctx: Any, fn: Callable, module: Any, shards: int, x: torch.Tensor, *params: torch.Tensor):
        ctx.fn, ctx.module, ctx.shards = fn, module, shards
        ctx.save_for_backward(x, *params)
        with torch.no_grad():
            return torch.cat([fn(module, tile) for tile in x.chunk(shards, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, *params = ctx.saved_tensors
        width = x.shape[-1]
        # Rows of [batch * seq, hidden]: tiles that are contiguous for any batch size.
        rows, grad_rows = x.detach().reshape(-1, width), grad.reshape(-1, grad.shape[-1])
        x_grad = torch.zeros_like(rows) if ctx.needs_input_grad[3] else None
        param_grads: list[Any] = [None] * len(params)
        offset = 0
        for index, tile in enumerate(rows.chunk(ctx.shards, dim=0)):
            tile = tile.detach().requires_grad_(x_grad is not None)
            with torch.enable_grad():
                out = ctx.fn(ctx.module, tile)
            if index == 0:
                _check_covered(out, [tile], params, "TiledMLP")
            wrt = ([tile] if x_grad is not None else []) + list(params)
            grads = _grads(out, wrt, grad_rows[offset:offset + tile.shape[0]])
            if x_grad is not None:
                x_grad[offset:offset + tile.shape[0]] = grads.pop(0)
            _add(param_grads, grads)
            offset += tile.shape[0]
        return (None, None, None, None if x_grad is None else x_grad.view_as(x), *param_grads)


class TiledMLP:
    """`TiledMLP.apply(fn, self, x, shards, compute_params)`: fn(self, x) (an MLP: position-wise) computed
    in `shards` tiles of x's rows (x: [batch, seq, hidden] or [tokens, hidden]); its activations are
    those of one tile, in forward and backward. The weights are `compute_params` (None: self's)."""

    @staticmethod
    def apply(fn: Callable, self: Any, x: torch.Tensor, shards: int, compute_params: Sequence[Any] | None = None):
        if not torch.is_tensor(x) or x.dim() < 2:
            raise SequenceParallelError(f"TiledMLP: x must be [batch, seq, hidden] or [tokens, hidden], got "
                                        f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        shards = _check_shards(shards, x.shape[-2], "TiledMLP")
        return _TiledRows.apply(fn, self, shards, x, *_trainable(compute_params, self))


# --------------------------------------------------------------------------------- TiledFusedLogitsLoss
class _TiledLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fn: Callable, module: Any, y: torch.Tensor, mask: torch.Tensor | None, shards: int,
                reduction: str, x: torch.Tensor, *params: torch.Tensor):
        needs_x = ctx.needs_input_grad[6]
        rows = x.detach().reshape(-1, *x.shape[2:])
        y_rows = y.reshape(-1, *y.shape[2:])
        mask_rows = mask.reshape(-1) if mask is not None else None
        x_grad = torch.zeros_like(rows) if needs_x else None
        param_grads: list[Any] = [None] * len(params)
        losses = []
        offset = 0
        row_tiles = rows.chunk(shards)  # may be fewer than `shards` (torch.chunk's rounding)
        tiles = list(zip(row_tiles, y_rows.chunk(shards),
                         mask_rows.chunk(shards) if mask_rows is not None else [None] * len(row_tiles)))
        # The incoming gradient is 1 here (scaled in backward): d(mean of tile losses)/d(one) = 1/tiles.
        scale = torch.tensor(1.0 / len(tiles) if reduction == "mean" else 1.0, dtype=x.dtype, device=x.device)
        for index, (tile, y_tile, mask_tile) in enumerate(tiles):
            tile = tile.detach().requires_grad_(needs_x)
            args = (module, tile, y_tile) + ((mask_tile,) if mask_tile is not None else ())
            with torch.enable_grad():
                loss = fn(*args)
            if not torch.is_tensor(loss) or loss.numel() != 1:
                raise SequenceParallelError(f"TiledFusedLogitsLoss: fn returned "
                                            f"{tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__};"
                                            f" it must return one loss value per tile")
            if index == 0 and (needs_x or params):
                _check_covered(loss, [tile], params, "TiledFusedLogitsLoss")
            wrt = ([tile] if needs_x else []) + list(params)
            if wrt and loss.requires_grad:
                grads = _grads(loss, wrt, scale.to(loss.dtype).expand_as(loss))
                if needs_x:
                    x_grad[offset:offset + tile.shape[0]] = grads.pop(0)
                _add(param_grads, grads)
            losses.append(loss.detach().reshape(()))
            offset += tile.shape[0]
        stacked = torch.stack(losses)
        ctx.save_for_backward(*(g for g in [x_grad.view_as(x) if x_grad is not None else None, *param_grads]
                                if g is not None))
        ctx.present = [g is not None for g in [x_grad, *param_grads]]
        return stacked.mean() if reduction == "mean" else stacked.sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad if present else None for present in ctx.present]
        return (None, None, None, None, None, None, *grads)


class TiledFusedLogitsLoss:
    """`TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params, output_reduction)`: the loss
    fn(self, x_tile, y_tile[, mask_tile]) (e.g. lm_head then cross-entropy) over `shards` tiles of the
    [batch, seq] positions, "mean" (of the tiles' losses) or "sum"; no tile's logits outlive it. The
    backward runs tile by tile inside forward; backward only scales what it found."""

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
        return _TiledLoss.apply(fn, self, y, mask, shards, output_reduction, x,
                                *_trainable(compute_params, self))


# --------------------------------------------------------------------------------- SequenceTiledCompute
class _TiledSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fn: Callable, seqlen: int, shards: int, keys_to_shard: list[str], keys_to_pass: list[str],
                grad_key: str, unshard_dim: int, n_args: int, *tensors_and_params: Any):
        args, params = list(tensors_and_params[:n_args]), tensors_and_params[n_args:]
        sharded = dict(zip(keys_to_shard, args[:len(keys_to_shard)]))
        passed = dict(zip(keys_to_pass, args[len(keys_to_shard):]))
        step = math.ceil(seqlen / shards)
        ctx.fn, ctx.step, ctx.grad_key, ctx.unshard_dim = fn, step, grad_key, unshard_dim
        # Passed tensors get no gradient (as in DeepSpeed): detached, their history stays out of the recompute.
        ctx.keys_to_shard, ctx.n_args = keys_to_shard, n_args
        ctx.passed = {k: v.detach() if torch.is_tensor(v) else v for k, v in passed.items()}
        ctx.save_for_backward(*(sharded[k] for k in keys_to_shard), *params)
        with torch.no_grad():
            outputs = [fn(**{k: v[:, i:i + step] for k, v in sharded.items()}, **passed)
                       for i in range(0, seqlen, step)]
        return _join(outputs, unshard_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        saved = ctx.saved_tensors
        sharded = dict(zip(ctx.keys_to_shard, saved[:len(ctx.keys_to_shard)]))
        params = list(saved[len(ctx.keys_to_shard):])
        whole = sharded[ctx.grad_key]
        needs = ctx.needs_input_grad[8 + ctx.keys_to_shard.index(ctx.grad_key)]
        key_grad = torch.zeros_like(whole) if needs else None
        param_grads: list[Any] = [None] * len(params)
        seqlen = whole.shape[1]
        for index, start in enumerate(range(0, seqlen, ctx.step)):
            tiles = {k: v.detach()[:, start:start + ctx.step] for k, v in sharded.items()}
            tiles[ctx.grad_key] = tiles[ctx.grad_key].detach().requires_grad_(needs)
            with torch.enable_grad():
                out = ctx.fn(**tiles, **ctx.passed)
            if index == 0:
                _check_covered(out, [tiles[ctx.grad_key]], params, "SequenceTiledCompute")
            wrt = ([tiles[ctx.grad_key]] if needs else []) + params
            if ctx.unshard_dim == 0:  # one value per tile: its gradient is the tile's entry
                grad_out = grad[index].reshape(out.shape)
            else:
                grad_out = grad.narrow(ctx.unshard_dim, start, out.shape[ctx.unshard_dim])
            grads = _grads(out, wrt, grad_out)
            if needs:
                key_grad[:, start:start + tiles[ctx.grad_key].shape[1]] = grads.pop(0)
            _add(param_grads, grads)
        arg_grads: list[Any] = [None] * ctx.n_args
        arg_grads[ctx.keys_to_shard.index(ctx.grad_key)] = key_grad
        return (None,) * 8 + (*arg_grads, *param_grads)


def _join(outputs: list[torch.Tensor], dim: int) -> torch.Tensor:
    if dim == 0:  # one value (e.g. a loss) per tile
        return torch.stack([o.reshape(()) if o.numel() == 1 else o for o in outputs])
    return torch.cat(outputs, dim=dim)


def _reduce(output: torch.Tensor, reduction: str | None) -> torch.Tensor:
    if reduction is None:
        return output
    return output.mean() if reduction == "mean" else output.sum()


class SequenceTiledCompute:
    """`SequenceTiledCompute.apply(fn, seqlen, shards, keys_to_shard, keys_to_pass, grad_requiring_tensor_key,
    compute_params, output_unshard_dimension, output_reduction, *args)`: DeepSpeed's positional form of
    `sequence_tiled_compute` (args: the tensors to shard, then those to pass, in key order)."""

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
    every [batch, seq, ...] tensor in kwargs_to_shard), the outputs joined along `output_unshard_dimension`
    (0: one value per tile, e.g. a loss) and reduced by `output_reduction` (None, "mean" or "sum").
    Gradients flow to kwargs_to_shard[grad_requiring_tensor_key] and to the weights: `compute_params`,
    or (None) the parameters of the modules among kwargs_to_pass."""
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
    modules = [v for v in kwargs_to_pass.values() if isinstance(v, torch.nn.Module)]
    params = _trainable(compute_params, *modules)
    keys_to_shard = list(kwargs_to_shard)
    out = _TiledSequence.apply(fn, seqlen, shards, keys_to_shard, list(kwargs_to_pass), grad_requiring_tensor_key,
                               output_unshard_dimension, len(keys_to_shard) + len(kwargs_to_pass),
                               *kwargs_to_shard.values(), *kwargs_to_pass.values(), *params)
    return _reduce(out, output_reduction)
