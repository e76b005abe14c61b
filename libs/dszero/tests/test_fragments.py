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


def local_pieces(rank, world, stage):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, reduce_bucket_size=500,
                                                       stage3_param_persistence_threshold=0))
    weight = dict(model.named_parameters())["blocks.0.mlp.0.weight"]
    zero.backward(loss_of(model, _batch(rank, world)))
    span = dszero.fragments.local_range(weight)
    grad = dszero.safe_get_local_grad(weight)
    value = dszero.safe_get_local_fp32_param(weight)
    shape = tuple(dszero.safe_get_full_fp32_param(weight).shape)  # the whole shape (partitioned at stage 3)
    dszero.safe_set_full_grad(weight, torch.full(shape, 0.25))  # at stage 1: each rank's share of the reduction
    set_grad = dszero.safe_get_full_grad(weight)
    with pytest.raises(dszero.ZeroError, match="value has shape"):
        dszero.safe_set_full_grad(weight, torch.zeros(3))
    zero.step()
    exp_avg = dszero.safe_get_local_optimizer_state(weight, "exp_avg")
    return span, grad, value, set_grad, exp_avg


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_local_pieces_tile_the_whole_parameter_and_a_set_gradient_is_the_one_stepped(stage):
    grad_ref, _, _ = reference()
    start_value = make_model().state_dict()["blocks.0.mlp.0.weight"].reshape(-1)
    got = sorted(run_ranks(local_pieces, 2, stage, timeout=120), key=lambda r: r[0])
    spans = [r[0] for r in got]
    assert spans[0][0] == 0 and spans[-1][1] == grad_ref.numel() and spans[0][1] == spans[1][0]  # the two tile it
    assert all(r[1].dtype == torch.float32 and r[1].dim() == 1 for r in got)
    torch.testing.assert_close(torch.cat([r[1] for r in got]), grad_ref.reshape(-1), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.cat([r[2] for r in got]), start_value, rtol=0, atol=0)
    exp_avg = torch.cat([r[4] for r in got])
    for r in got:
        assert torch.all(r[3] == 0.25)
    torch.testing.assert_close(exp_avg, torch.full_like(exp_avg, 0.1 * 0.25))  # AdamW's first m: (1 - 0.9) g


def set_local_pieces(rank, world, stage):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, reduce_bucket_size=500,
                                                       stage3_param_persistence_threshold=0))
    weight = dict(model.named_parameters())["blocks.0.mlp.0.weight"]
    first, last = dszero.fragments.local_range(weight)
    mine = torch.arange(first, last, dtype=torch.float32)  # each element's own index: the pieces tile 0..n-1
    stored = tuple(weight.ds_tensor.shape) if stage == 3 else None
    zero.backward(loss_of(model, _batch(rank, world)))
    dszero.safe_set_local_grad(weight, mine * 2)
    grad = dszero.safe_get_full_grad(weight)
    with pytest.raises(dszero.ZeroError, match="this rank holds"):
        dszero.safe_set_local_grad(weight, torch.zeros(last - first + 1))
    dszero.safe_set_local_fp32_param(weight, mine)
    value = dszero.safe_get_full_fp32_param(weight)
    with dszero.GatheredParameters([weight]):
        model_weight = weight.detach().float().clone()
    zero.step()
    dszero.safe_set_local_optimizer_state(weight, mine * 3, "exp_avg")
    exp_avg = dszero.safe_get_full_optimizer_state(weight, "exp_avg")
    dszero.safe_set_full_optimizer_state(weight, torch.ones(tuple(value.shape)), "exp_avg_sq")
    exp_avg_sq = dszero.safe_get_local_optimizer_state(weight, "exp_avg_sq")
    return (first, last), stored, grad, value, model_weight, exp_avg, exp_avg_sq


@pytest.mark.parametrize("stage", [2, 3])
def test_local_setters_write_this_ranks_piece_and_ds_tensor_is_its_size(stage):
    got = run_ranks(set_local_pieces, 2, stage, timeout=120)
    numel = got[0][2].numel()
    whole = torch.arange(numel, dtype=torch.float32)
    for (first, last), stored, grad, value, model_weight, exp_avg, exp_avg_sq in got:
        torch.testing.assert_close(grad.reshape(-1), whole * 2, rtol=0, atol=0)  # both ranks' pieces, as one
        torch.testing.assert_close(value.reshape(-1), whole, rtol=0, atol=0)
        torch.testing.assert_close(model_weight.reshape(-1), whole, rtol=0, atol=0)  # the weights followed
        torch.testing.assert_close(exp_avg.reshape(-1), whole * 3, rtol=0, atol=0)
        assert exp_avg_sq.numel() == last - first and torch.all(exp_avg_sq == 1)
        if stage == 3:
            assert stored == (last - first,)


def set_then_sgd(rank, world, stage, grad_accum_dtype):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).bfloat16()
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=1.0), ZeroConfig(stage=stage),
                                precision="bf16", grad_accum_dtype=grad_accum_dtype)
    before = model.weight.detach().float().clone()
    zero.backward(model(torch.full((1, 3), float(rank + 1), dtype=torch.bfloat16)).sum())  # differs per rank
    model.weight.grad = torch.ones_like(model.weight)  # a hand-set .grad is replaced too
    dszero.safe_set_full_grad(model.weight, torch.full((2, 3), 0.5))
    zero.step()
    return (before - model.weight.detach().float()).tolist()


@pytest.mark.parametrize("stage,grad_accum_dtype", [(0, None), (1, None), (1, torch.float32)])
def test_a_set_full_gradient_is_the_one_stepped_where_gradients_are_reduced_at_the_step(stage, grad_accum_dtype):
    """Stages 0 and 1 reduce each rank's own gradient at the step: every rank's share makes the value."""
    for moved in run_ranks(set_then_sgd, 2, stage, grad_accum_dtype, timeout=120):
        # 0.5 as the step applied it, within the bf16 rounding of the weights (2**-8 of them).
        torch.testing.assert_close(torch.tensor(moved), torch.full((2, 3), 0.5), rtol=0, atol=2.0**-8)
