"""The ZeRO passes: where a stage-3 unit is gathered and released, and where gradients are handed to
ZeRO's reduction (every stage).

zero3_compile: in every graph, each unit whose parameters the graph reads is gathered (`gather`, then
`wait_gather`) just before the first node that reads one of them, each parameter becomes a view of the
gathered flat weights, and `release` follows the last node that reads the memory. A parameter that the
graph only passes on (the forward saving it for backward) stays the placeholder: the backward graph
gathers it again. In backward graphs each parameter gradient is handed to `reduce_grad` where it is
computed and the graph returns None for it, so autograd accumulates nothing.

zero1_compile / zero2_compile: the backward part only (parameters are whole at stages 1 and 2).
"""

from __future__ import annotations

import torch
from torch import fx

from .. import ops
from ..graph import (
    example_empty,
    output_node,
    outputs,
    placeholders,
    positions,
    real_users,
    tensor_outputs_of,
    value_of,
)
from ..graphinfo import BACKWARD, GraphInfo, ParamSlot

_NOT_READS = ops.BOOKKEEPING


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


def add_gather_release(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    order = positions(graph)
    output = output_node(graph)
    by_unit: dict[int, list[tuple[fx.Node, ParamSlot, list[fx.Node]]]] = {}
    for node in placeholders(graph):
        slot = info.param_of(node.name)
        if slot is None or slot.unit is None or slot.persistent or slot.unit in info.kept_units:
            continue
        readers = [user for user in node.users if user is not output]
        if readers:
            by_unit.setdefault(slot.unit, []).append((node, slot, readers))
    for unit_key, members in sorted(by_unit.items(), key=lambda item: min(order[r] for m in item[1] for r in m[2])):
        unit = info.units[unit_key]
        first = min((r for _, _, readers in members for r in readers), key=order.__getitem__)
        anchor = members[0][0]
        with graph.inserting_before(first):
            start = graph.call_function(ops.gather, (anchor, [], info.runtime, unit.key, unit.numel, unit.dtype))
            start.meta["val"] = example_empty(anchor, unit.numel, unit.dtype)
            start.meta["dscompile_unit"] = unit.key
            wait = graph.call_function(ops.wait_gather, (start, info.runtime, unit.key))
            wait.meta["val"] = start.meta["val"]
            wait.meta["dscompile_unit"] = unit.key
            for placeholder, slot, readers in members:
                whole = graph.call_function(torch.ops.aten.as_strided.default,
                                            (wait, list(slot.shape), list(_contiguous_stride(slot.shape)), slot.offset))
                whole.meta["val"] = value_of(placeholder)
                for reader in readers:
                    reader.replace_input_with(placeholder, whole)
        order = positions(graph)
        users = [u for u in real_users(wait, ignore=_NOT_READS)]
        if output in users:  # the graph hands a gathered parameter on: its memory leaves with it
            continue
        after = [t for user in users for t in tensor_outputs_of(user)]
        with graph.inserting_after(max([*users, *after], key=order.__getitem__)):
            release = graph.call_function(ops.release, (wait, after, info.runtime, unit.key))
            release.meta["dscompile_unit"] = unit.key
    graph.lint()
    return graph


def add_reduce(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    """Backward graphs: hand each parameter gradient to `reduce_grad` and return None for it."""
    if info.kind != BACKWARD:
        return graph
    output = output_node(graph)
    values = outputs(graph)
    for index, slot in sorted(info.grad_outputs.items()):
        grad = values[index] if index < len(values) else None
        if not isinstance(grad, fx.Node):
            continue
        with graph.inserting_after(grad):  # as soon as it is computed
            node = graph.call_function(ops.reduce_grad, (grad, info.runtime, slot.key))
            node.meta["dscompile_param"] = slot.key
        values[index] = None
    output.args = (tuple(values),)
    graph.lint()
    return graph


def zero3_compile(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    return add_reduce(add_gather_release(graph, info), info)


def zero12_compile(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    return add_reduce(graph, info)
