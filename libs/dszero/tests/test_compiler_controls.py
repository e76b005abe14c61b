"""CompilerControls, what a compiler (dscompile) drives ZeRO through: a unit gathered into the caller's
buffer is the whole weights; gradients handed over reduce exactly as autograd's (stages 2 and 3, in any
order); module hooks come off and back; a unit kept gathered stays so and leaves the live count."""

import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def _zero(stage):
    model = make_model()
    return model, dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                       ZeroConfig(stage=stage, stage3_param_persistence_threshold=0))


def _handed_over(rank, world, stage):
    tokens = next(batches(1, 1, world, rank))[0]
    model, zero = _zero(stage)
    zero.backward(loss_of(model, tokens))
    by_autograd = [g.clone() for g in zero.reducer.reduce()]
    controls = dszero.CompilerControls(zero)
    model2, zero2 = _zero(stage)
    controls2 = dszero.CompilerControls(zero2)
    params = controls2.params()
    with dszero.GatheredParameters(params):
        whole = [p.detach().clone().requires_grad_() for p in params]
    lookup = dict(zip(map(id, params), whole))
    copies = {name: lookup[id(p)] for name, p in model2.named_parameters()}
    loss = loss_of(lambda t: torch.func.functional_call(model2, copies, (t,)), tokens)
    grads = torch.autograd.grad(loss, whole)

    def hand_over():  # in reverse: a compiled backward need not produce them in the order ZeRO reduces
        for param, grad in reversed(list(zip(params, grads))):
            controls2.accept_gradient(param, grad)

    # Handed over from inside a backward pass, as a compiled graph's op does (the end-of-backward callback).
    anchor = torch.zeros(1, requires_grad=True)
    anchor.register_hook(lambda g: hand_over())
    (anchor * 1).sum().backward()
    by_hand = [g.clone() for g in zero2.reducer.reduce()]
    return [torch.equal(a, b) for a, b in zip(by_autograd, by_hand)], len(controls.params())


def _units(rank, world):
    _model, zero = _zero(3)
    controls = dszero.CompilerControls(zero)
    unit = controls.units()[0]
    buffer = torch.empty(unit.layout.padded_numel, dtype=unit.dtype)
    controls.gather_into(unit, buffer, async_op=True).wait()
    with dszero.GatheredParameters(unit.params):
        expected = torch.cat([p.detach().reshape(-1) for p in unit.params])
    gathered_ok = torch.equal(buffer[:expected.numel()], expected) and not unit.gathered
    live = zero.reducer.live_numel()
    controls.keep_gathered(unit, True)
    kept = (unit.gathered, unit.persistent, zero.reducer.live_numel() == live)
    controls.keep_gathered(unit, False)
    back = (unit.gathered, unit.persistent)
    hooks = len(zero.reducer.module_hook_handles)
    controls.remove_module_hooks()
    off = len(zero.reducer.module_hook_handles)
    controls.restore_module_hooks()
    return gathered_ok, kept, back, (hooks > 0, off, len(zero.reducer.module_hook_handles) == hooks)


def _controls(rank, world):
    return {2: _handed_over(rank, world, 2), 3: _handed_over(rank, world, 3)}, _units(rank, world)


def test_handed_over_gradients_reduce_as_autograds_do_and_units_gather_stay_kept_and_unhook():
    # One start of the ranks for every check (each start costs the suite seconds).
    for handed, (gathered_ok, kept, back, hooks) in run_ranks(_controls, 2, timeout=120):
        for stage, (same, count) in handed.items():
            assert all(same) and count > 0, stage
        assert gathered_ok
        assert kept == (True, True, True)  # persistent units are not counted as live
        assert back == (False, False)
        assert hooks == (True, 0, True)
