"""selective_gather: keep whole, across steps, the units whose gathers cost most per byte, as far as the
memory budget allows; the graph then reads their parameters directly and gathers them no more.

`choose_kept_units` decides (pure: the same sizes, budget and measured times give every rank the same
choice): units are taken by measured gather seconds per byte, highest first (unmeasured ones by their
size, smallest first: a collective's fixed cost weighs most on small ones), while the kept bytes
- plus the most the graphs gather at once stay within the live budget (`stage3_max_live_parameters`),
- plus the graphs' profiled peak stay within `peak_bytes` (a kept unit is held through every node of every
  graph, and keeping it only takes gathers out, so the peak grows by at most the kept bytes), and
- on an accelerator, within the memory the profile left free.
The runtime sets `peak_bytes` from the steps before the switch when none is given (`keep_budget`): their
profiled peak plus `keep_margin` of that peak and the model states, so keeping units never raises the
step's memory more than that above what ZeRO-3 without them needs. It gathers the chosen units once and
marks them persistent in dszero (`keep_gathered`); this pass then takes their gathers out of the graph.
"""

from __future__ import annotations

from torch import fx

from .. import ops
from ..graph import placeholders
from ..graphinfo import Budgets, GraphInfo, Profile, UnitSlot


def keep_budget(graph_peak: int, resident_bytes: int, margin: float) -> int:
    """The `peak_bytes` selective gather keeps units within, when none is given: the graphs' profiled peak with
    nothing kept (`graph_peak`) plus `margin` of the step's whole peak (that and the model states the rank
    holds across steps, `resident_bytes`)."""
    if graph_peak < 0 or resident_bytes < 0 or not margin >= 0:
        raise ValueError(f"keep_budget: graph_peak {graph_peak}, resident_bytes {resident_bytes} and margin {margin} "
                         f"must be non-negative")
    return graph_peak + int(margin * (graph_peak + resident_bytes))


def choose_kept_units(units: dict[int, UnitSlot], gathered_at_once: int, budgets: Budgets,
                      profile: Profile | None = None, headroom_bytes: int | None = None,
                      graph_peak: int | None = None) -> frozenset[int]:
    """The units to keep gathered. `graph_peak`: the highest peak of the graphs with none of `units` kept
    (memory.profile_memory); with `budgets.peak_bytes`, kept bytes stay within peak_bytes - graph_peak."""
    budget = budgets.live_bytes - gathered_at_once
    if headroom_bytes is not None:
        budget = min(budget, headroom_bytes)
    if budgets.peak_bytes is not None and graph_peak is not None:
        budget = min(budget, budgets.peak_bytes - graph_peak)
    seconds = profile.gather_seconds if profile is not None else {}

    def rank(unit: UnitSlot) -> tuple[float, int, int]:
        cost = seconds.get(unit.key)
        per_byte = cost / unit.nbytes if cost is not None and unit.nbytes else 1.0 / max(unit.nbytes, 1)
        return (-per_byte, unit.nbytes, unit.key)

    kept, total = [], 0
    for unit in sorted(units.values(), key=rank):
        if total + unit.nbytes <= budget:
            kept.append(unit.key)
            total += unit.nbytes
    return frozenset(kept)


def selective_gather(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    if not info.kept_units:
        return graph
    by_offset = {(slot.unit, slot.offset): node for node in placeholders(graph)
                 if (slot := info.param_of(node.name)) is not None and slot.unit in info.kept_units}
    removed = 0
    for start in [n for n in graph.nodes if n.op == "call_function" and n.target is ops.gather]:
        unit = start.args[3]
        if unit not in info.kept_units:
            continue
        for wait in list(start.users):
            for user in list(wait.users):
                if user.target is ops.release:
                    graph.erase_node(user)
                elif user.target is not ops.release:
                    placeholder = by_offset[(unit, user.args[3])]
                    user.replace_all_uses_with(placeholder)
                    graph.erase_node(user)
            graph.erase_node(wait)
        graph.erase_node(start)
        removed += 1
    info.decisions["kept_units"] = sorted(info.kept_units)
    if removed:  # the runtime marks kept units persistent before the graphs are compiled again, so zero3_compile
        # gave them no gathers; only a graph compiled while they were partitioned has any to take out
        info.decisions["gathers_removed"] = info.decisions.get("gathers_removed", 0) + removed
    graph.lint()
    return graph
