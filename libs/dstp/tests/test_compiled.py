"""Handing the collectives to a compiler: dstp's graph operators are its regions' collectives (2 gloo ranks),
the layers stop communicating while deferred and start again when restored, and what a compiler pass cannot
emit is refused by name."""

import pytest
import tiny_models
import torch

import dscomm
import dstp
from dscomm.testing import run_ranks


def operators_and_deferral(rank, world):
    groups = dscomm.ParallelDims(world, tensor=world).build()
    model = tiny_models.model("llama")
    state = dstp.parallelize(model, groups.tensor, preset_model="llama")
    name = state.tensor_group.group_name
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    entered = torch.ops.dstp.copy_to_region(x, name)
    (entered * (rank + 1)).sum().backward()  # each rank's partial gradient: rank + 1
    reduced = torch.ops.dstp.reduce_from_region(x.detach() * 1, name)
    layers = dstp.defer_collectives_to_compiler(model)
    ids = tiny_models.tokens(0)
    state.tensor_group.clock.reset()
    model(input_ids=ids, labels=ids).loss.backward()
    deferred = state.tensor_group.clock.collectives  # the layers' own: none
    dstp.restore_collectives(model)
    model(input_ids=ids, labels=ids).loss.backward()
    return (entered.tolist(), x.grad.tolist(), reduced.tolist(), sorted(set(layers.values())), deferred,
            state.tensor_group.clock.collectives)


def test_operators_and_deferral():
    for rank, (entered, grad, reduced, kinds, deferred, restored) in enumerate(run_ranks(operators_and_deferral, 2,
                                                                                         timeout=120)):
        assert entered == [rank + 1.0] * 3 and grad == [3.0] * 3 and reduced == [3.0] * 3
        assert kinds == ["column", "row"] and deferred == 0 and restored > 0


def refused(rank, world):
    groups = dscomm.ParallelDims(world, tensor=world).build()
    messages = []
    for options in ({"tp_overlap_comm": True}, {"vocab_parallel_lm_head": True}):
        model = tiny_models.model("llama")
        dstp.parallelize(model, groups.tensor, preset_model="llama", **options)
        try:
            dstp.defer_collectives_to_compiler(model)
        except dstp.TensorParallelError as exc:
            messages.append(str(exc))
    try:
        dstp.defer_collectives_to_compiler(tiny_models.model("llama"))
    except dstp.TensorParallelError as exc:
        messages.append(str(exc))
    return messages


def test_what_a_pass_cannot_emit_is_refused_by_name():
    messages = run_ranks(refused, 2, timeout=120)[0]
    assert "tp_overlap_comm" in messages[0]
    assert "lm_head.weight (vocab_parallel_lm_head" in messages[1] and "drop 'autotp'" in messages[1]
    assert "not tensor-parallel" in messages[2]


@pytest.fixture(autouse=True, scope="module")
def _modeling_code_loaded_before_forking():
    tiny_models.model("llama")
