"""HeldParameters: stage-3 weights gathered once for many forwards (generation), with no collective per
forward, and a training step after the block identical to one without it."""

import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def make():
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    return model, zero


def step(model, zero, tokens):
    zero.backward(loss_of(model, tokens))
    zero.step()
    zero.zero_grad()


def forwards_in_a_held_block(rank, world, hold):
    model, zero = make()
    data = list(batches(3, 1, world, rank))
    step(model, zero, data[0][0])
    outputs, gathers = [], None
    if hold:
        reference = make_model()  # the whole model, to compare with
        with dszero.GatheredParameters(model.parameters()):
            reference.load_state_dict(model.state_dict())
        before = sum(u.gather_count for u in zero.groups)
        with dszero.HeldParameters(model.parameters()), torch.no_grad():
            held_numel = sum(p.numel() for p in model.parameters())
            for _ in range(2 + 3 * rank):  # ranks run different numbers of forwards: no collective may be inside
                outputs.append(torch.equal(model(data[1][0][:, :-1]), reference(data[1][0][:, :-1])))
        gathers = sum(u.gather_count for u in zero.groups) - before
    released = sum(p.numel() for p in model.parameters())
    step(model, zero, data[1][0])
    step(model, zero, data[2][0])
    with dszero.GatheredParameters(model.parameters()):
        weights = {k: v.clone() for k, v in model.state_dict().items()}
    units = len(zero.groups)
    return outputs, gathers, units, held_numel if hold else None, released, weights


def test_a_held_block_gathers_once_and_training_after_it_is_unchanged():
    held = run_ranks(forwards_in_a_held_block, 2, True, timeout=120)
    plain = run_ranks(forwards_in_a_held_block, 2, False, timeout=120)
    full = sum(p.numel() for p in make_model().parameters())
    for rank, (outputs, gathers, units, held_numel, released, weights) in enumerate(held):
        assert outputs == [True] * (2 + 3 * rank)  # whole weights, exactly
        assert gathers == units  # one gather per unit for the whole block, none per forward
        assert held_numel == full and released == 0  # gathered inside, released after
        for name, value in plain[rank][-1].items():
            assert torch.equal(value, weights[name]), name  # bit-identical training after the block


def backward_inside(rank, world):
    model, _zero = make()
    tokens = next(batches(1, 1, world, rank))[0]
    try:
        with dszero.HeldParameters(model.parameters()):
            loss_of(model, tokens).backward()
    except dszero.ZeroError as exc:
        return str(exc), sum(p.numel() for p in model.parameters())
    return None, None


def test_a_backward_through_held_parameters_is_refused_and_they_are_released():
    for message, left in run_ranks(backward_inside, 2, timeout=60):
        assert "HeldParameters" in message and left == 0
