"""prefetch and selective gather on real graphs: budgets hold in the plan and when the graphs run."""

import copy
import dataclasses

import pytest
import torch
from graphs import LocalRuntime, infos, reference, run_pair

from dscompile import Budgets, Profile, UnitSlot, ops, profile_memory
from dscompile.graph import count_calls, positions
from dscompile.passes import choose_kept_units, keep_budget, prefetch, selective_gather, zero3_compile


def _rewritten(captured, runtime, budgets, kept=frozenset()):
    forward, backward = infos(captured, runtime.id, budgets=budgets, kept_units=kept)
    graphs = []
    for graph, info in ((captured.forward.graph, forward), (captured.backward.graph, backward)):
        graphs.append(selective_gather(prefetch(zero3_compile(copy.deepcopy(graph), info), info), info))
    return graphs, forward, backward


def _gather_order(graph):
    return [n.args[3] for n in graph.nodes if n.target is ops.gather]


@pytest.mark.parametrize("units_ahead", [1, 2])
def test_prefetch_moves_gathers_early_within_the_bytes_and_count_it_was_given(captured, units_ahead):
    runtime = LocalRuntime(captured.model)
    plain, forward, _ = _rewritten(captured, runtime, Budgets())
    largest = max(u.nbytes for u in forward.units.values())
    budget = Budgets(prefetch_bytes=units_ahead * largest, gathers_ahead=units_ahead)
    (fw, bw), forward, _ = _rewritten(captured, runtime, budget)
    assert forward.decisions["prefetched"] > 0
    assert _gather_order(fw) == _gather_order(plain[0])  # every rank keeps the same collective order
    outs, _ = run_pair(captured, fw, bw)
    torch.testing.assert_close(outs, reference(captured)[0])
    assert runtime.peak_ahead <= budget.prefetch_bytes  # gathered ahead of use, as the graphs ran
    for graph in (fw, bw):  # and in the plan: at no node more than `units_ahead` gathers in flight
        order, waits, starts = positions(graph), {}, {}
        for node in graph.nodes:
            if node.target is ops.gather:
                starts[node] = order[node]
            elif node.target is ops.wait_gather:
                waits[node.args[0]] = order[node]
        for i in range(len(order)):
            assert sum(1 for g in starts if starts[g] < i < waits[g]) <= units_ahead


def test_prefetch_keeps_the_graphs_peak_under_a_given_budget(captured):
    runtime = LocalRuntime(captured.model)
    (base, _), forward, _ = _rewritten(captured, runtime, Budgets())
    baseline = profile_memory(base, forward).max_peak
    for extra in (0, 600, 10_000):
        budget = Budgets(prefetch_bytes=1 << 30, gathers_ahead=4, peak_bytes=baseline + extra)
        (fw, _), forward, _ = _rewritten(captured, runtime, budget)
        assert profile_memory(fw, forward).max_peak <= baseline + extra
    assert forward.decisions["prefetched"] > 0  # the roomiest budget let gathers move


def test_no_prefetch_budget_moves_nothing(captured):
    runtime = LocalRuntime(captured.model)
    _, forward, _ = _rewritten(captured, runtime, Budgets(prefetch_bytes=0))
    assert forward.decisions.get("prefetched", 0) == 0


def test_selective_gather_takes_kept_units_out_of_the_graphs(captured):
    runtime = LocalRuntime(captured.model)
    (fw, bw), _, _ = _rewritten(captured, runtime, Budgets(), kept=frozenset({1, 3}))
    assert sorted(_gather_order(fw)) == [0, 2] and sorted(_gather_order(bw)) == [2]
    outs, _ = run_pair(captured, fw, bw, hollow=False)  # kept units are whole: the graph reads them directly
    torch.testing.assert_close(outs, reference(captured)[0])
    assert count_calls(bw, ops.reduce_grad) == 7  # kept or not, every gradient is reduced


def test_selective_gather_keeps_no_more_than_the_profiled_peak_allows(captured):
    # The warm-up entry's graphs (zero3_compile alone, nothing kept) give the profiled peak, as at a switch.
    runtime = LocalRuntime(captured.model)
    (fw0, bw0), forward, backward = _rewritten(captured, runtime, Budgets())
    graph_peak = max(profile_memory(fw0, forward).max_peak, profile_memory(bw0, backward).max_peak)
    at_once = max(profile_memory(fw0, forward).max_gathered, profile_memory(bw0, backward).max_gathered)
    units = forward.units
    model_bytes = sum(u.nbytes for u in units.values())
    # the live budget alone (stage3_max_live_parameters' default) would keep every unit
    assert choose_kept_units(units, at_once, Budgets(), graph_peak=graph_peak) == frozenset(units)
    resident = 4 * model_bytes  # shards, gradients and Adam's two states of 2 ranks: twice the weights
    peak_bytes = keep_budget(graph_peak, resident, margin=0.1)
    allowance = peak_bytes - graph_peak
    assert 0 < allowance < model_bytes  # a budget smaller than the model
    budget = Budgets(prefetch_bytes=1 << 30, gathers_ahead=4, peak_bytes=peak_bytes)
    kept = choose_kept_units(units, at_once, budget, graph_peak=graph_peak)
    kept_bytes = sum(units[k].nbytes for k in kept)
    assert 0 < len(kept) < len(units) and kept_bytes <= allowance
    (fw, bw), forward, backward = _rewritten(captured, runtime, budget, kept)
    assert forward.decisions["kept_units"] == sorted(kept)
    for graph, info in ((fw, forward), (bw, backward)):  # kept units are held at every node, beside the rest
        assert profile_memory(graph, info).max_peak + kept_bytes <= peak_bytes
        assert not set(_gather_order(graph)) & kept
    outs, _ = run_pair(captured, fw, bw, hollow=False)
    torch.testing.assert_close(outs, reference(captured)[0])
    # no room above the profiled peak: nothing is kept
    assert choose_kept_units(units, at_once, Budgets(peak_bytes=graph_peak), graph_peak=graph_peak) == frozenset()
    with pytest.raises(ValueError, match="margin"):
        keep_budget(graph_peak, resident, margin=float("nan"))


def test_the_kept_units_fit_the_live_budget_costliest_per_byte_first():
    units = {k: UnitSlot(k, n, torch.float32) for k, n in enumerate([100, 400, 50, 1000])}
    assert choose_kept_units(units, 0, Budgets(live_bytes=10**9)) == frozenset(units)
    assert choose_kept_units(units, 0, Budgets(live_bytes=0)) == frozenset()
    # unmeasured: the smallest first (a collective's fixed cost weighs most there)
    assert choose_kept_units(units, 0, Budgets(live_bytes=4 * 160)) == frozenset({0, 2})
    # what the graphs gather at once comes off the budget
    assert choose_kept_units(units, 4 * 100, Budgets(live_bytes=4 * 160)) == frozenset({2})
    # measured: seconds per byte decide (unit 3 is slow for its size)
    profile = Profile(gather_seconds={0: 1e-4, 1: 4e-4, 2: 5e-5, 3: 1.0})
    assert choose_kept_units(units, 0, Budgets(live_bytes=4 * 1000), profile) == frozenset({3})
    assert choose_kept_units(units, 0, Budgets(live_bytes=10**9), profile, headroom_bytes=4 * 150) == frozenset({0, 2})


def test_budgets_are_plain_data():
    assert dataclasses.replace(Budgets(), prefetch_bytes=1).prefetch_bytes == 1
