"""The arithmetic of one stage on one micro-batch: forward, full backward (B), and backward split into
the input gradient (I) and the weight gradient (W) for zero-bubble schedules.

A stage runs as pieces (`PipelineModule.stage_segments`). When its schedule splits backward, each
piece's input is a fresh leaf of the previous piece's output, so I walks back piece by piece with
`torch.autograd.grad(outputs, inputs=piece inputs)` keeping each piece's graph and output gradient,
and W later runs `torch.autograd.backward(outputs, grads, inputs=piece parameters)`: the weight
gradients only, nothing computed twice. Without a split the stage is one piece and B is one
`torch.autograd.backward`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .wire import flatten


@dataclass
class Piece:
    """One piece of a stage as it ran: its input (leaves where backward starts from) and output."""

    inputs: Any
    output: Any
    params: list[torch.nn.Parameter]
    grads: list[torch.Tensor] | None = None  # gradient of the differentiable outputs, kept by I for W


@dataclass
class Work:
    """A (stage, micro-batch) of one batch, from its forward to its last backward."""

    stage: int
    micro_batch: int
    inputs: Any = None
    pieces: list[Piece] = field(default_factory=list)
    output: Any = None  # what F gives the next stage (the loss on the last stage)
    loss: torch.Tensor | None = None
    output_grads: list[torch.Tensor] | None = None  # gradient of the float outputs, from the next stage
    input_grads: list[torch.Tensor] | None = None  # gradient of the float inputs, for the previous stage
    input_done: bool = False
    weights_done: bool = False


def floats(value: Any) -> list[torch.Tensor]:
    """The tensors of a stage output that carry gradients between stages (floating point)."""
    if value is None:
        return []
    return [t for t in (value if isinstance(value, (tuple, list)) else [value])
            if torch.is_tensor(t) and t.is_floating_point()]


def fresh_leaves(value: Any) -> Any:
    """`value` cut from its graph: float tensors become leaves that require grad."""
    if torch.is_tensor(value):
        leaf = value.detach()
        return leaf.requires_grad_(True) if leaf.is_floating_point() else leaf
    if isinstance(value, (tuple, list)):
        return type(value)(fresh_leaves(v) for v in value)
    return value


def run_forward(segments: list[Any], inputs: Any, split: bool) -> list[Piece]:
    """Run a stage's segments on `inputs`; with `split`, each piece starts from fresh leaves."""
    if not split:
        output = inputs
        for segment in segments:
            output = segment.run(output)
        return [Piece(inputs, output, [p for s in segments for p in s.params])]
    pieces, value = [], inputs
    for index, segment in enumerate(segments):
        piece_in = value if index == 0 else fresh_leaves(value)
        value = segment.run(piece_in)
        pieces.append(Piece(piece_in, value, list(segment.params)))
    return pieces


def attach_loss(pieces: list[Piece], loss_fn: Callable[..., Any] | None, labels: Any, compute_loss: bool) -> Any:
    """The last stage's loss from its output (the output itself without a loss_fn); it tops the last piece."""
    output = pieces[-1].output
    loss = loss_fn(output, labels) if (loss_fn is not None and compute_loss) else output
    pieces[-1].output = loss
    return loss


def _differentiable(output: Any, grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(outputs that require grad, their gradients), matching the float outputs to `grads` in order."""
    outs, matched = [], []
    for tensor, grad in zip(floats(output), grads, strict=True):
        if tensor.requires_grad:
            outs.append(tensor)
            matched.append(grad)
    return outs, matched


def _input_grads(piece_inputs: Any) -> list[torch.Tensor]:
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in floats(piece_inputs)]


def top_grads(work: Work, scale: float) -> list[torch.Tensor]:
    """The gradient entering the stage's output: the received one, or d(loss * scale) on the last stage."""
    if work.loss is not None:
        return [torch.full_like(t, scale) for t in floats(work.loss)]
    return work.output_grads or []


def backward_full(work: Work, scale: float) -> None:
    """B: parameter and input gradients together (the pieces in reverse, one autograd pass each)."""
    grads = top_grads(work, scale)
    for piece in reversed(work.pieces):
        outs, matched = _differentiable(piece.output, grads)
        if outs:
            torch.autograd.backward(outs, matched)
        grads = _input_grads(piece.inputs)
    work.input_grads = grads if any(t.requires_grad for t in floats(work.inputs)) else None
    work.input_done = work.weights_done = True
    work.pieces = []


def backward_input(work: Work, scale: float) -> None:
    """I: the gradient of the stage's inputs only; each piece keeps its graph and output gradient for W."""
    grads = top_grads(work, scale)
    for index in range(len(work.pieces) - 1, -1, -1):
        piece = work.pieces[index]
        outs, matched = _differentiable(piece.output, grads)
        piece.grads = matched
        leaves = [t for t in floats(piece.inputs) if t.requires_grad]
        if not outs or not leaves:
            grads = [torch.zeros_like(t) for t in floats(piece.inputs)]
            continue
        keep = bool(piece.params)  # W runs this graph again for the weights
        found = torch.autograd.grad(outs, leaves, matched, retain_graph=keep, allow_unused=True)
        by_id = {id(leaf): g for leaf, g in zip(leaves, found, strict=True)}
        grads = [by_id.get(id(t)) if by_id.get(id(t)) is not None else torch.zeros_like(t)
                 for t in floats(piece.inputs)]
        if not keep:
            piece.output = None
    work.input_grads = grads if any(t.requires_grad for t in floats(work.inputs)) else None
    work.input_done = True


def backward_weights(work: Work) -> None:
    """W: the parameters' gradients from the graphs and output gradients I kept. The pieces' graphs are
    disjoint (each starts from fresh leaves), so one autograd pass over all of them computes each
    weight's gradient once."""
    outs: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    params: dict[int, torch.Tensor] = {}
    for piece in work.pieces:
        mine = [p for p in piece.params if p.requires_grad]
        if not mine or piece.output is None or not piece.grads:
            continue
        outs += [t for t in floats(piece.output) if t.requires_grad]
        grads += piece.grads
        params.update((id(p), p) for p in mine)
    if outs:
        torch.autograd.backward(outs, grads, inputs=list(params.values()))
    work.weights_done = True
    work.pieces = []


def as_tensors(value: Any, where: str) -> tuple[list[torch.Tensor], bool]:
    return flatten(value, where)
