"""free_activation and offload_activation: what a backward pass may do with the activations the forward
saved for it (only those `activations.py` finds safe: computed by the forward, aliasing nothing else).

free_activation (compile.free_activation): in a backward graph, an activation of at least
`free_activation_threshold` bytes has its memory handed back (`free_tensors`) right after the last node
that reads it, instead of when autograd drops the whole saved set after the graph. Not with
`retain_graph=True`: a second backward would find the freed activations gone.

offload_activation: in a forward graph, each saved activation of at least 5 MB (the largest first, until
the forward's memory profile is under `offload_activation_budget` when one is given) is copied to host
memory (`offload_tensor`) and the host copy is what the forward saves; the backward graph brings it back
(`reload_tensor`) early enough that the copy, at the measured bandwidth, takes no longer than the
profiled compute before its first use (right before it, without a profile).
"""

from __future__ import annotations

from torch import fx

from .. import ops
from ..graph import nbytes, output_node, outputs, placeholders, positions, real_users, tensor_outputs_of
from ..graphinfo import BACKWARD, FORWARD, GraphInfo
from ..memory import profile_memory


def free_activation(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    if info.kind != BACKWARD:
        return graph
    output = output_node(graph)
    freed = 0
    for node in placeholders(graph):
        if node.name not in info.activation_inputs or nbytes(node) < info.budgets.free_activation_bytes:
            continue
        readers = real_users(node, ignore=ops.BOOKKEEPING)
        if not readers or output in readers:
            continue
        order = positions(graph)
        after = [t for reader in readers for t in tensor_outputs_of(reader)]
        with graph.inserting_after(max([*readers, *after], key=order.__getitem__)):
            graph.call_function(ops.free_tensors, ([node], after, info.runtime))
        freed += 1
    info.decisions["freed_activations"] = info.decisions.get("freed_activations", 0) + freed
    graph.lint()
    return graph


def offload_activation(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    if info.kind == FORWARD:
        return _offload_forward(graph, info)
    if info.kind == BACKWARD:
        return _reload_backward(graph, info)
    return graph


def _offload_forward(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    values = outputs(graph)
    floor = info.budgets.offload_activation_bytes
    candidates = sorted(((nbytes(values[i]), i) for i in info.saved_activations if nbytes(values[i]) >= floor),
                        reverse=True)
    budget = info.budgets.offload_activation_budget
    excess = None if budget is None else profile_memory(graph, info).max_peak - budget
    chosen = []
    for size, index in candidates:
        if excess is not None and excess <= 0:
            break
        chosen.append(index)
        if excess is not None:
            excess -= size
    output = output_node(graph)
    for index in chosen:
        node = values[index]
        with graph.inserting_after(node):
            host = graph.call_function(ops.offload_tensor, (node, info.runtime, index))
            host.meta["val"] = node.meta.get("val")
        values[index] = host
    output.args = (tuple(values),)
    info.decisions["offloaded"] = sorted(info.saved_activations[i] for i in chosen)
    graph.lint()
    return graph


def _reload_backward(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    times = info.profile.node_seconds.get(info.graph_id, {}) if info.profile is not None else {}
    bandwidth = info.profile.copy_bytes_per_second if info.profile is not None else None
    reloaded = 0
    for key, node in enumerate(placeholders(graph)):
        if node.name not in info.offloaded:
            continue
        readers = [u for u in node.users if u.target not in ops.BOOKKEEPING]
        if not readers:
            continue
        nodes = list(graph.nodes)
        order = positions(graph)
        first = min(readers, key=order.__getitem__)
        at = order[first]
        if bandwidth:  # early enough for the copy to finish behind the compute before its first use
            needed, covered = nbytes(node) / bandwidth, 0.0
            while at - 1 >= 0 and nodes[at - 1].op != "placeholder" and covered < needed:
                at -= 1
                covered += times.get(nodes[at].name, 0.0)
        with graph.inserting_before(nodes[at]):
            back = graph.call_function(ops.reload_tensor, (node, [], info.runtime, key))
            back.meta["val"] = node.meta.get("val")
        for reader in readers:
            reader.replace_input_with(node, back)
        reloaded += 1
    info.decisions["reloaded"] = info.decisions.get("reloaded", 0) + reloaded
    graph.lint()
    return graph
