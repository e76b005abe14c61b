"""prefetch: start each unit's all-gather early enough to hide it behind the compute before its use.

Gathers are visited in graph order; each `gather` moves back from its `wait_gather` while every node it
would then run beside keeps to the budgets (`Budgets`): the bytes gathered ahead of use stay within
`prefetch_bytes`, at most `gathers_ahead` gathers are in flight, gathered parameters stay within
`live_bytes`, and, when given, the graph's memory stays within `peak_bytes` (the memory profile plus
every gather moved so far). Units selective gather keeps gathered count in both at every node: the graph
holds them throughout, beside what it gathers. A gather never moves above its own inputs or another gather, so gathers keep
their order: every rank issues the same collectives in the same order.
"""

from __future__ import annotations

from torch import fx

from .. import ops
from ..graph import nbytes, positions
from ..graphinfo import GraphInfo
from ..memory import profile_memory


def prefetch(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    budgets = info.budgets
    if budgets.prefetch_bytes <= 0 or budgets.gathers_ahead <= 0:
        return graph
    memory = profile_memory(graph, info)
    kept = sum(info.units[k].nbytes for k in info.kept_units if k in info.units)
    nodes = list(graph.nodes)
    order = positions(graph)
    first_compute = next((i for i, n in enumerate(nodes) if n.op != "placeholder"), len(nodes))
    extra = [0] * len(nodes)  # bytes of gathers moved over each node
    ahead = [0] * len(nodes)  # bytes gathered ahead of use while each node runs
    in_flight = [0] * len(nodes)
    moved = 0
    after_previous = first_compute  # a gather stays after the one before it (before this node, or later)
    for start in [n for n in nodes if n.op == "call_function" and n.target is ops.gather]:
        size = nbytes(start)
        here = order[start]
        floor = max([after_previous, *(order[a] + 1 for a in start.all_input_nodes)])
        after_previous = here + 1

        def fits(i: int, size: int = size) -> bool:
            if in_flight[i] + 1 > budgets.gathers_ahead or ahead[i] + size > budgets.prefetch_bytes:
                return False
            if kept + memory.gathered[i] + extra[i] + size > budgets.live_bytes:
                return False
            return budgets.peak_bytes is None or kept + memory.peak[i] + extra[i] + size <= budgets.peak_bytes

        position = here
        while position - 1 >= floor and fits(position - 1):
            position -= 1
        while position < here and nodes[position].target is ops.gather:
            position += 1
        if position == here:
            continue
        for i in range(position, here):
            extra[i] += size
            ahead[i] += size
            in_flight[i] += 1
        nodes[position].prepend(start)
        after_previous = position
        moved += 1
    info.decisions["prefetched"] = info.decisions.get("prefetched", 0) + moved
    graph.lint()
    return graph
