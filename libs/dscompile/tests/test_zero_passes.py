"""The ZeRO passes on real forward/backward graphs, run against a local stand-in for the runtime: the
rewritten graphs compute what the originals did, gathering each unit once per graph and releasing it
after its last reader, and hand every gradient to reduce_grad."""

import copy

import pytest
import torch
from graphs import LocalRuntime, infos, reference, run_pair

from dscompile import ops, profile_memory
from dscompile.graph import count_calls, placeholders, positions, real_users
from dscompile.passes import zero3_compile, zero12_compile


def test_zero3_inserts_one_gather_wait_release_per_unit_and_graph(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id)
    fw = zero3_compile(copy.deepcopy(captured.forward.graph), forward)
    bw = zero3_compile(copy.deepcopy(captured.backward.graph), backward)
    assert count_calls(fw, ops.gather) == count_calls(fw, ops.wait_gather) == count_calls(fw, ops.release) == 4
    # backward needs the weights of up, down and head (not the embedding's: its gradient needs no weight)
    assert count_calls(bw, ops.gather) == count_calls(bw, ops.release) == 3
    assert count_calls(bw, ops.reduce_grad) == 7 and count_calls(fw, ops.reduce_grad) == 0
    # nothing reads a partitioned parameter's placeholder any more: the forward only passes it on (saved for
    # backward), and a gather names it (its anchor) without reading it
    for graph, info in ((fw, forward), (bw, backward)):
        for node in placeholders(graph):
            if node.name in info.params:
                assert all(user.op == "output" or user.target is ops.gather for user in node.users), node.name


def test_zero3_graphs_compute_what_the_originals_did(captured):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id)
    fw = zero3_compile(copy.deepcopy(captured.forward.graph), forward)
    bw = zero3_compile(copy.deepcopy(captured.backward.graph), backward)
    outs, grads = run_pair(captured, fw, bw, hollow=True)  # the parameters hold no memory at all
    want_outs, want_grads = reference(captured)
    torch.testing.assert_close(outs, want_outs)
    assert all(g is None for g in grads[:7])  # gradients go to reduce_grad, not back to autograd
    for position, (name, _) in enumerate(captured.params):
        torch.testing.assert_close(runtime.grads[backward.grad_outputs[position].key], want_grads[position], msg=name)
    assert runtime.live == 0 and runtime.count("gather") == runtime.count("release") == 7


def test_each_release_follows_every_reader_of_its_unit(captured):
    runtime = LocalRuntime(captured.model)
    forward, _ = infos(captured, runtime.id)
    fw = zero3_compile(copy.deepcopy(captured.forward.graph), forward)
    order = positions(fw)
    for release in [n for n in fw.nodes if n.target is ops.release]:
        readers = real_users(release.args[0], ignore=ops.BOOKKEEPING)
        assert readers and all(order[r] < order[release] for r in readers)


def test_the_memory_profile_sees_one_unit_gathered_at_a_time(captured):
    runtime = LocalRuntime(captured.model)
    forward, _ = infos(captured, runtime.id)
    fw = zero3_compile(copy.deepcopy(captured.forward.graph), forward)
    largest = max(u.nbytes for u in forward.units.values())
    assert profile_memory(fw, forward).max_gathered == largest


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_only_hand_gradients_over(captured, stage):
    runtime = LocalRuntime(captured.model)
    forward, backward = infos(captured, runtime.id, stage=stage)
    fw = zero12_compile(copy.deepcopy(captured.forward.graph), forward)
    bw = zero12_compile(copy.deepcopy(captured.backward.graph), backward)
    assert count_calls(fw, ops.gather) == 0 and count_calls(bw, ops.gather) == 0
    assert count_calls(bw, ops.reduce_grad) == 7
    run_pair(captured, fw, bw, hollow=False)
    _, want = reference(captured)
    for position in range(7):
        torch.testing.assert_close(runtime.grads[backward.grad_outputs[position].key], want[position])
