"""free_activation, offload_activation, offload_adam_states and offload_parameters on real graphs: what
they insert, that only safe activations are touched, and that the graphs still compute the same."""

import copy

import torch
from graphs import LocalRuntime, infos, reference, run_pair

from dscompile import Budgets, ops
from dscompile.activations import forward_outputs, saved_activations
from dscompile.graph import count_calls, outputs, placeholders
from dscompile.passes import (
    free_activation,
    offload_activation,
    offload_adam_states,
    offload_parameters,
    record_inputs,
    zero3_compile,
)


def _activations(captured, backward):
    found = saved_activations(forward_outputs(captured.forward.graph), captured.num_saved)
    backward.activation_inputs = set(found.values())
    return found


def test_saved_activations_are_computed_tensors_aliasing_nothing_handed_on(captured):
    found = _activations(captured, infos(captured, 0)[1])
    graph_outputs = outputs(captured.forward.graph)
    names = {n.name for n in placeholders(captured.forward.graph)}
    assert found and all(index >= len(graph_outputs) - captured.num_saved for index in found)
    assert not set(found.values()) & names  # inputs and parameters are not activations
    assert graph_outputs[0].name not in found.values()  # nor the user's output


def test_free_activation_frees_after_the_last_reader_only_from_the_threshold(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id, budgets=Budgets(free_activation_bytes=0))
    _activations(captured, backward)
    bw = free_activation(zero3_compile(copy.deepcopy(captured.backward.graph), backward), backward)
    freed = count_calls(bw, ops.free_tensors)
    assert freed == backward.decisions["freed_activations"] > 0
    fw = zero3_compile(copy.deepcopy(captured.forward.graph), forward)
    run_pair(captured, fw, bw)
    _, want = reference(captured)
    for position in range(7):
        torch.testing.assert_close(runtime.grads[backward.grad_outputs[position].key], want[position])
    assert runtime.count("free") == freed
    _, big = infos(captured, runtime.id, budgets=Budgets(free_activation_bytes=1 << 30))
    _activations(captured, big)
    assert count_calls(free_activation(copy.deepcopy(captured.backward.graph), big), ops.free_tensors) == 0


def test_offloaded_activations_come_back_before_backward_reads_them(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id, budgets=Budgets(offload_activation_bytes=0))
    forward.saved_activations = _activations(captured, backward)
    fw = offload_activation(zero3_compile(copy.deepcopy(captured.forward.graph), forward), forward)
    backward.offloaded = set(forward.decisions["offloaded"])
    bw = offload_activation(zero3_compile(copy.deepcopy(captured.backward.graph), backward), backward)
    assert count_calls(fw, ops.offload_tensor) == len(backward.offloaded) > 0
    assert count_calls(bw, ops.reload_tensor) == backward.decisions["reloaded"] == len(backward.offloaded)
    outs, _ = run_pair(captured, fw, bw)
    want_outs, want = reference(captured)
    torch.testing.assert_close(outs, want_outs)
    for position in range(7):
        torch.testing.assert_close(runtime.grads[backward.grad_outputs[position].key], want[position])


def test_offload_activation_stops_once_the_forward_fits_its_budget(captured):
    forward, backward = infos(captured, 0, budgets=Budgets(offload_activation_bytes=0,
                                                          offload_activation_budget=1 << 40))
    forward.saved_activations = _activations(captured, backward)
    offload_activation(copy.deepcopy(captured.forward.graph), forward)
    assert forward.decisions["offloaded"] == []


def test_optimizer_states_leave_in_the_first_forward_and_return_in_backward(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id)
    fw = offload_adam_states(zero3_compile(copy.deepcopy(captured.forward.graph), forward), forward)
    bw = offload_adam_states(zero3_compile(copy.deepcopy(captured.backward.graph), backward), backward)
    assert count_calls(fw, ops.offload_states) == 1 and count_calls(bw, ops.reload_states) == 1
    forward.first_graph = False
    assert count_calls(offload_adam_states(copy.deepcopy(captured.forward.graph), forward), ops.offload_states) == 0
    run_pair(captured, fw, bw)
    assert [c for c in runtime.calls if c[0].endswith("states")] == [("offload_states", 0), ("reload_states", 0)]


def test_parameter_shards_leave_after_their_release_and_return_before_their_gather(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id)
    fw = offload_parameters(zero3_compile(copy.deepcopy(captured.forward.graph), forward), forward)
    bw = offload_parameters(zero3_compile(copy.deepcopy(captured.backward.graph), backward), backward)
    assert count_calls(fw, ops.offload_param) == count_calls(fw, ops.release) == 4
    assert count_calls(bw, ops.reload_param) == count_calls(bw, ops.gather) == 3
    for start in [n for n in bw.nodes if n.target is ops.gather]:
        assert any(dep.target is ops.reload_param for dep in start.args[1])  # the gather waits for its shard
    run_pair(captured, fw, bw)
    backward_calls = runtime.calls[runtime.calls.index(("offload_param", 3)) + 1:]
    gathers = [i for i, call in enumerate(backward_calls) if call[0] == "gather"]
    assert len(gathers) == 3
    assert all(backward_calls[i - 1] == ("reload_param", backward_calls[i][1]) for i in gathers)


def test_record_inputs_names_every_tensor_input_once(captured):
    runtime = LocalRuntime(captured.model)
    forward, _ = infos(captured, runtime.id)
    graph = record_inputs(copy.deepcopy(captured.forward.graph), forward)
    (node,) = [n for n in graph.nodes if n.target is ops.record_inputs]
    assert len(node.args[0]) == len(placeholders(graph))
