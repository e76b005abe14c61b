"""The memory a graph holds as it runs, from its nodes' example values (exact sizes, no process needed).

Each node that is not a view allocates its value; a value's memory goes back after the last node that
reads it or a view of it (as inductor and FX's code free them); graph outputs live to the end. Inputs
are counted as held by the caller, except ZeRO parameters (partitioned: their placeholders hold none).
A gather allocates its unit's whole flat weights; the release after its last reader hands them back
(a value is held until every node that takes it has run, the passes' own ops included).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx

from . import ops
from .graph import is_view, nbytes, output_node, positions, real_users
from .graphinfo import GraphInfo


@dataclass(frozen=True)
class MemoryProfile:
    names: list[str]  # node names, in order
    live: list[int]  # bytes held after each node ran
    peak: list[int]  # bytes held while each node ran (its inputs and its output at once)
    gathered: list[int]  # of `peak`, the bytes of gathered parameters (stage 3) while each node ran

    @property
    def max_peak(self) -> int:
        return max(self.peak, default=0)

    @property
    def max_gathered(self) -> int:
        return max(self.gathered, default=0)


def profile_memory(graph: fx.Graph, info: GraphInfo | None = None) -> MemoryProfile:
    order = positions(graph)
    nodes = list(graph.nodes)
    out = output_node(graph)
    params = info.params if info is not None else {}
    alloc = [0] * len(nodes)
    free_after = [[] for _ in nodes]
    gathered_alloc = [False] * len(nodes)
    held_inputs = 0
    for node in nodes:
        if node.op in ("output",) or is_view(node):
            continue
        size = nbytes(node)
        if node.op == "placeholder":
            if node.name not in params:
                held_inputs += size
            continue
        if node.op == "call_function" and node.target in ops.BOOKKEEPING:
            continue
        index = order[node]
        alloc[index] = size
        gathered_alloc[index] = node.op == "call_function" and node.target is ops.gather
        readers = real_users(node)
        if out in readers:
            continue  # an output: lives on
        last = max((order[r] for r in readers), default=index)
        free_after[last].append(index)
    live, peak, gathered = [], [], []
    current = held_inputs
    current_gathered = 0
    for index, _node in enumerate(nodes):
        current += alloc[index]
        if gathered_alloc[index]:
            current_gathered += alloc[index]
        peak.append(current)
        gathered.append(current_gathered)
        for freed in free_after[index]:
            current -= alloc[freed]
            if gathered_alloc[freed]:
                current_gathered -= alloc[freed]
        live.append(current)
    return MemoryProfile([n.name for n in nodes], live, peak, gathered)
