"""What the passes read from an FX graph: node order, aliases (views share their base's memory), the
uses that really read a tensor, and how many bytes a node's value holds. Pure functions of the graph."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx


def output_node(graph: fx.Graph) -> fx.Node:
    for node in reversed(graph.nodes):
        if node.op == "output":
            return node
    raise ValueError("the graph has no output node")


def outputs(graph: fx.Graph) -> list[Any]:
    """The graph's flat output values (nodes, or None / constants)."""
    value = output_node(graph).args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def placeholders(graph: fx.Graph) -> list[fx.Node]:
    return [node for node in graph.nodes if node.op == "placeholder"]


def is_view(node: fx.Node) -> bool:
    """A node whose value shares memory with its first argument (aten view ops, and the items of a view
    op's list result, such as split's)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, fx.Node) and is_view(source)
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def alias_base(node: fx.Node) -> fx.Node:
    """The node whose memory `node`'s value lives in (itself unless it is a view)."""
    while is_view(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def real_users(node: fx.Node, ignore: Iterable[Any] = ()) -> list[fx.Node]:
    """The nodes that read `node`'s memory: its users and its views' users, views themselves excluded
    (a view computes nothing). `ignore`: targets that do not count as a use (the passes' own ops)."""
    skip = set(ignore)
    found: dict[fx.Node, None] = {}
    stack = [node]
    while stack:
        current = stack.pop()
        for user in current.users:
            if user.op == "call_function" and user.target in skip:
                continue
            if is_view(user):
                stack.append(user)
            else:
                found[user] = None
    return list(found)


def positions(graph: fx.Graph) -> dict[fx.Node, int]:
    return {node: index for index, node in enumerate(graph.nodes)}


def tensor_values(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensor_values(item)]
    return []


def value_of(node: fx.Node) -> Any:
    """The node's example value (a fake tensor, a tuple of them, a SymInt), or None."""
    value = node.meta.get("val")
    return value if value is not None else node.meta.get("example_value")


def example_empty(anchor: fx.Node, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An example value (meta["val"]) for a node a pass adds, on the anchor's device: a fake tensor in the
    anchor's fake mode, as AOT autograd's own nodes hold, or, in a graph traced with real values, a tensor
    with no storage. Never real memory: graphs (and the runtime's copies of them) live as long as the
    compiled code, and a real buffer per inserted gather would hold a unit's size each, for good."""
    value = value_of(anchor)
    device = value.device if isinstance(value, torch.Tensor) else torch.device("cpu")
    mode = getattr(value, "fake_mode", None)
    if mode is not None:
        with mode:
            return torch.empty(numel, dtype=dtype, device=device)
    empty = torch.empty(numel, dtype=dtype, device=device)
    empty.untyped_storage().resize_(0)
    return empty


def nbytes(node: fx.Node) -> int:
    """Bytes of memory the node's value holds (its tensors' elements; 0 when unknown or symbolic)."""
    total = 0
    for tensor in tensor_values(value_of(node)):
        try:
            total += int(tensor.numel()) * tensor.element_size()
        except (TypeError, RuntimeError):  # symbolic sizes
            continue
    return total


def tensor_outputs_of(user: fx.Node) -> list[fx.Node]:
    """What to wait on so that `user` has run: itself when it yields tensors, else the getitems of its tuple
    (nothing when it yields no tensor: an op kept alive for its side effect)."""
    value = value_of(user)
    if isinstance(value, torch.Tensor):
        return [user]
    items = [u for u in user.users if u.op == "call_function" and u.target is operator.getitem
             and isinstance(value_of(u), torch.Tensor)]
    return items[:1]


def count_calls(graph: fx.Graph, target: Any) -> int:
    return sum(1 for node in graph.nodes if node.op == "call_function" and node.target is target)
