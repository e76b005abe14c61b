"""Which tensors a forward graph saves for backward are activations the passes may free or move: computed
by the graph itself (not an input, not a parameter gathered for it), and sharing memory with nothing the
graph hands elsewhere (its outputs to the user, another saved tensor). Pure functions of the graph."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import fx

from . import ops
from .graph import alias_base, outputs, value_of


@dataclass(frozen=True)
class ForwardOutputs:
    """A forward graph's outputs as the backward graph will need them: names, and which are safe."""

    names: list[str | None]  # per output index: the node's name (None for a constant)
    safe: list[bool]  # per output index: a tensor the graph computed, sharing memory with no other output


def forward_outputs(graph: fx.Graph) -> ForwardOutputs:
    values = outputs(graph)
    bases = [alias_base(v) if isinstance(v, fx.Node) else None for v in values]
    shared = Counter(b for b in bases if b is not None)
    names, safe = [], []
    for value, base in zip(values, bases):
        names.append(value.name if isinstance(value, fx.Node) else None)
        ok = (isinstance(value, fx.Node) and isinstance(value_of(value), torch.Tensor) and base.op != "placeholder"
              and shared[base] == 1 and not (base.op == "call_function" and base.target in ops.ALL))
        safe.append(ok)
    return ForwardOutputs(names, safe)


def saved_activations(forward: ForwardOutputs, num_saved: int) -> dict[int, str]:
    """{output index: name} of the last `num_saved` outputs (those saved for backward) that are safe."""
    start = len(forward.names) - num_saved
    return {i: forward.names[i] for i in range(max(start, 0), len(forward.names)) if forward.safe[i]}
