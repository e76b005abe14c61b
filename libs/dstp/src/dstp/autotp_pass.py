"""DeepCompile's autotp pass: AutoTP's collectives emitted into the compiled graph.

    runtime = dstp.compile_autotp(model, backend="inductor")   # model already cut by dstp.parallelize
    model(input_ids=ids, labels=ids).loss.backward()           # the graph enters and leaves each region

`compile_autotp` turns the layers' own collectives off (`defer_collectives_to_compiler`, which refuses what
a pass cannot stand in for) and compiles the model with a backend that runs `insert_tp_collectives` on every
graph dynamo captures, before inductor or AOT autograd: each linear whose weight is a column-parallel
layer's reads its input through `torch.ops.dstp.copy_to_region` (one per distinct input, so q, k and v, or
gate and up, share one input-gradient all-reduce, as the eager layers do), and each linear whose weight is a
row-parallel layer's has its partial output summed by `torch.ops.dstp.reduce_from_region` before the bias is
added. AOT autograd derives the backward collectives from the operators' registered gradients. After the
first call every deferred layer must have been found in some graph: a layer run outside the graphs would
run without its collective, so that is refused by name rather than trained wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from .apply import _named_modules, state_of
from .compiled import defer_collectives_to_compiler, restore_collectives
from .errors import TensorParallelError

_LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)


def insert_tp_collectives(gm: torch.fx.GraphModule, example_inputs: list, kinds: dict[int, tuple[str, str]],
                          group: str) -> set[str]:
    """The pass: `kinds` maps id(weight) -> (layer name, "column" | "row"); returns the layers it found."""
    graph = gm.graph
    by_node: dict[torch.fx.Node, tuple[str, str]] = {}
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.Tensor) and id(value) in kinds:
            by_node[node] = kinds[id(value)]
    found: set[str] = set()
    entries: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _LINEAR:
            continue
        weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        layer = by_node.get(weight)
        if layer is None:
            continue
        name, kind = layer
        found.add(name)
        if kind == "column":
            x = node.args[0]
            if x not in entries:  # at its first column reader: later readers share it
                with graph.inserting_before(node):
                    entries[x] = graph.call_function(torch.ops.dstp.copy_to_region.default, (x, group))
            node.replace_input_with(x, entries[x])
        else:
            bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            if bias is not None:
                raise TensorParallelError(f"the autotp pass: row-parallel layer {name} adds its bias inside the "
                                          f"matmul; the partial outputs must be summed before the bias")
            with graph.inserting_after(node):
                summed = graph.call_function(torch.ops.dstp.reduce_from_region.default, (node, group))
            node.replace_all_uses_with(summed, delete_user_cb=lambda user, summed=summed: user is not summed)
    graph.lint()
    gm.recompile()
    return found


@dataclass
class AutoTPRuntime:
    """What compile_autotp did: the deferred layers and which of them the graphs covered."""

    module: nn.Module
    layers: dict[str, str]
    backend: str
    original_forward: Callable[..., Any]
    group: str
    kinds: dict[int, tuple[str, str]]
    found: set[str] = field(default_factory=set)
    checked: bool = False
    _compiled: Callable[..., Any] | None = None

    def backend_fn(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        self.found |= insert_tp_collectives(gm, example_inputs, self.kinds, self.group)
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self._compiled(*args, **kwargs)
        if not self.checked:
            missing = sorted(set(self.layers) - self.found)
            if missing:
                raise TensorParallelError(f"the autotp pass found no matmul of {len(missing)} tensor-parallel "
                                          f"layer(s) in the compiled graphs ({', '.join(missing[:4])}"
                                          f"{' ...' if len(missing) > 4 else ''}): they ran outside them without "
                                          f"their collectives; drop 'autotp' from compile.passes for this model")
            self.checked = True
        return output


def compile_autotp(module: nn.Module, backend: str = "inductor", compile_kwargs: dict | None = None) -> AutoTPRuntime:
    """Compile a model cut by dstp.parallelize with its collectives in the graph, in place (its forward
    runs the compiled graph; `uncompile_autotp(runtime)` restores the eager layers)."""
    if isinstance(getattr(module.forward, "__self__", None), AutoTPRuntime):
        raise TensorParallelError(f"compile_autotp: {type(module).__name__} is already compiled with the autotp pass")
    layers = defer_collectives_to_compiler(module)
    modules = _named_modules(module)
    kinds = {id(modules[name].weight): (name, kind) for name, kind in layers.items()}
    runtime = AutoTPRuntime(module, layers, backend, module.forward, state_of(module).tensor_group.group_name, kinds)
    runtime._compiled = torch.compile(runtime.original_forward, backend=runtime.backend_fn, **(compile_kwargs or {}))
    module.forward = runtime.forward
    return runtime


def uncompile_autotp(runtime: AutoTPRuntime) -> None:
    """The model runs eagerly again, its layers communicating themselves."""
    if getattr(runtime.module.forward, "__self__", None) is runtime:
        del runtime.module.forward
    restore_collectives(runtime.module)
