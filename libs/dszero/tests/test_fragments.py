"""safe_get_full_fp32_param / safe_get_full_grad / safe_get_full_optimizer_state / safe_set_full_fp32_param
give one parameter's whole value at every stage, equal to what one process holds."""

import pytest
import torch
from models import loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def _batch(rank, world):
    tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(3))  # one global batch
    return tokens.chunk(world)[rank]


def inspect(rank, world, stage):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, reduce_bucket_size=500,
                                                       stage3_param_persistence_threshold=0))
    weight = dict(model.named_parameters())["blocks.0.mlp.0.weight"]
    zero.backward(loss_of(model, _batch(rank, world)))
    grad = dszero.safe_get_full_grad(weight)
    zero.step()
    zero.zero_grad()
    value = dszero.safe_get_full_fp32_param(weight)
    exp_avg = dszero.safe_get_full_optimizer_state(weight, "exp_avg")
    dszero.safe_set_full_fp32_param(weight, torch.full(tuple(value.shape), 0.5))
    with dszero.GatheredParameters([weight]):
        after_set = weight.detach().clone()
    try:
        dszero.safe_get_full_optimizer_state(weight, "nope")
    except dszero.ZeroError as exc:
        missing = str(exc)
    return grad, value, exp_avg, after_set, missing


def reference():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_of(model, _batch(0, 1)).backward()
    weight = dict(model.named_parameters())["blocks.0.mlp.0.weight"]
    grad = weight.grad.clone()
    opt.step()
    return grad, weight.detach().clone(), opt.state[weight]["exp_avg"].clone()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_whole_values_of_one_parameter_at_every_stage(stage):
    grad_ref, value_ref, exp_avg_ref = reference()
    for grad, value, exp_avg, after_set, missing in run_ranks(inspect, 2, stage, timeout=120):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(value, value_ref, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(exp_avg, exp_avg_ref, rtol=1e-5, atol=1e-7)
        assert torch.all(after_set == 0.5)
        assert "no optimizer state 'nope'" in missing and "exp_avg" in missing


def test_a_parameter_no_optimizer_trains_is_named():
    frozen = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(dszero.ZeroError, match=r"shape \(2, 3\) is not trained by a ZeroOptimizer"):
        dszero.safe_get_full_fp32_param(frozen)
