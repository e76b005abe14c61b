"""offload_adam_states and offload_parameters: memory that forward and backward do not read, moved to host
memory while they run.

offload_adam_states (compile.offload_opt_states): the step's first forward graph moves the optimizer
states (Adam's moments, separate master weights) to host memory before its first node; each backward
graph brings them back (`reload_states`) where its profiled remaining compute covers the copy (before
its output without a profile), and the runtime checks they are back when backward ends, so the
optimizer step always finds them home.

offload_parameters (compile.offload_parameters): after a unit's release in forward, its shard goes to
host memory (`offload_param`); in backward it comes back (`reload_param`) before its gather, which waits
for it. On the CPU the shards already live in host memory and the ops move nothing.
"""

from __future__ import annotations

import torch
from torch import fx

from .. import ops
from ..graph import output_node, placeholders, value_of
from ..graphinfo import BACKWARD, FORWARD, GraphInfo


def offload_adam_states(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    inputs = placeholders(graph)
    if info.kind == FORWARD and info.first_graph and inputs:
        first = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first):
            graph.call_function(ops.offload_states, (inputs[0], info.runtime))
    elif info.kind == BACKWARD:
        output = output_node(graph)
        nodes = list(graph.nodes)
        at = len(nodes) - 1  # the output node
        times = info.profile.node_seconds.get(info.graph_id, {}) if info.profile is not None else {}
        needed = info.profile.state_reload_seconds if info.profile is not None else 0.0
        covered = 0.0
        while times and at - 1 >= 0 and nodes[at - 1].op != "placeholder" and covered < needed:
            at -= 1
            covered += times.get(nodes[at].name, 0.0)
        before = nodes[at]
        after = [n for n in nodes[:at] if n.op == "call_function" and isinstance(value_of(n), torch.Tensor)][-1:]
        with graph.inserting_before(before if before is not output else output):
            graph.call_function(ops.reload_states, (after, info.runtime))
    graph.lint()
    return graph


def offload_parameters(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    moved = 0
    if info.kind == FORWARD:
        for release in [n for n in graph.nodes if n.op == "call_function" and n.target is ops.release]:
            with graph.inserting_after(release):
                graph.call_function(ops.offload_param, (list(release.args[1]), info.runtime, release.args[3]))
            moved += 1
    elif info.kind == BACKWARD:
        for start in [n for n in graph.nodes if n.op == "call_function" and n.target is ops.gather]:
            anchor, deps, runtime, unit = start.args[0], list(start.args[1]), start.args[2], start.args[3]
            with graph.inserting_before(start):
                token = graph.call_function(ops.reload_param, (anchor, runtime, unit))
                token.meta["val"] = anchor.meta["val"].new_empty(0) if "val" in anchor.meta else None
            start.args = (anchor, [*deps, token], *start.args[2:])
            moved += 1
    info.decisions["parameter_moves"] = info.decisions.get("parameter_moves", 0) + moved
    graph.lint()
    return graph


def record_inputs(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    """Not a scheduling pass: lets the runtime keep this graph's inputs for the next profiling run
    (compile.keep_int_input_tensors / keep_all_input_tensors say which values it keeps)."""
    inputs = [n for n in placeholders(graph) if "val" in n.meta and hasattr(n.meta["val"], "shape")]
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if first is None or not inputs:
        return graph
    with graph.inserting_before(first):
        graph.call_function(ops.record_inputs, (inputs, info.runtime, info.graph_id))
    graph.lint()
    return graph
