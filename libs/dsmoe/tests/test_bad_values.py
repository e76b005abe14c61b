"""Values that used to crash deep inside a gate or pass silently: a capacity factor of inf or 1e30
(OverflowError from the slot arithmetic) is refused by name, and NaN or inf reaching a gate (dsmoe's
TopKGate, AutoEP's router) raises an error naming the layer instead of turning the loss into NaN."""

import math
import re

import pytest
import torch
from moe_models import HIDDEN, mlp
from torch import nn

import dscomm
from dscomm.testing import run_ranks
from dsmoe import MoE, MoEError, autoep, expert_capacity, moe_layers, top1gating


@pytest.mark.parametrize("factor", [math.inf, 1e30, 3e38, math.nan, -1.0])
@pytest.mark.parametrize("key", ["capacity_factor", "eval_capacity_factor"])
def test_an_unusable_capacity_factor_is_refused_by_name(key, factor):
    with pytest.raises(MoEError, match=rf"{key}={re.escape(repr(factor))} must be a finite positive number of at most"):
        MoE(HIDDEN, mlp(), num_experts=4, k=2, **{key: factor})


@pytest.mark.parametrize("factor", [math.inf, 1e30])
def test_the_gating_functions_refuse_it_too(factor):
    with pytest.raises(MoEError, match="capacity_factor must be a positive number of at most"):
        top1gating(torch.randn(8, 4), capacity_factor=factor, min_capacity=0)
    with pytest.raises(MoEError, match="capacity_factor must be a positive number of at most"):
        expert_capacity(8, 4, factor, 0)


def test_the_largest_factor_still_routes():
    layer = MoE(HIDDEN, mlp(), num_experts=4, k=2, capacity_factor=1e4, min_capacity=0)
    out, _, _ = layer(torch.randn(6, HIDDEN))
    assert torch.isfinite(out).all()


def _model(k, dispatch, drop=True):
    torch.manual_seed(0)
    return nn.ModuleDict({"pre": nn.Linear(HIDDEN, HIDDEN),
                          "moe": MoE(HIDDEN, mlp(), num_experts=4, k=k, min_capacity=0, drop_tokens=drop,
                                     dispatch=dispatch)})


@pytest.mark.parametrize(("k", "dispatch", "drop"), [(1, "dense", True), (2, "sparse", True), (3, "sparse", False),
                                                     (1, "sparse", False)])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_reaching_the_gate_names_the_layer(k, dispatch, drop, bad):
    model = _model(k, dispatch, drop)
    moe_layers(model)  # names the layers (dstrain.initialize does it)
    hidden = torch.randn(6, HIDDEN)
    hidden[2, 3] = bad
    with pytest.raises(MoEError, match=r"MoE layer 'moe': \d+ of its 24 router logits are NaN or inf \(from 1 of "
                                       r"the 48 input values\)"):
        model["moe"](hidden)


def test_a_bad_router_weight_is_named_as_the_source():
    model = _model(2, "sparse")
    moe_layers(model)
    with torch.no_grad():
        model["moe"].deepspeed_moe.gate.wg.weight[1, 0] = math.inf
    with pytest.raises(MoEError, match=r"from 1 of the router's 32 weights"):
        model["moe"](torch.randn(6, HIDDEN))


def test_an_unnamed_layer_says_how_to_name_it():
    layer = MoE(HIDDEN, mlp(), num_experts=4, k=1, min_capacity=0)
    with pytest.raises(MoEError, match=r"an MoE layer \(unnamed: dsmoe.moe_layers\(model\) names them\)"):
        layer(torch.full((4, HIDDEN), math.nan))


# ------------------------------------------------------------------------------------------- AutoEP
def _autoep_model(size, group=None):
    import autoep_models as M

    from dsconfig import ExpertParallelConfig

    model = M.build("mixtral")
    autoep.apply(model, ExpertParallelConfig(enabled=True, autoep_size=size), group, backend="loop")
    return model, M


def test_autoep_names_the_layer_whose_router_sees_nan():
    pytest.importorskip("transformers")
    model, M = _autoep_model(1)
    name, layer = autoep.autoep_layers(model)[1]
    layer.register_forward_pre_hook(lambda _, args: (args[0].clone().fill_(math.nan),))
    with pytest.raises(MoEError, match=rf"MoE layer '{name}': 48 of its 48 router logits are NaN or inf \(from 192 "
                                       rf"of the 192 input values\)"):
        model(**M.batch(0))


def _nan_on_rank_one(rank, world):
    groups = dscomm.ParallelDims(world, expert=2).build()
    model, M = _autoep_model(2, groups.expert)
    name, layer = autoep.autoep_layers(model)[0]
    if rank == 1:
        with torch.no_grad():
            layer.router_module.weight[0, 0] = math.nan
    try:
        model(**M.batch(rank))
    except MoEError as exc:
        return name, str(exc)
    return name, "no error"


def test_autoep_ranks_all_report_the_rank_whose_router_saw_nan():
    pytest.importorskip("transformers")
    for rank, (name, message) in enumerate(run_ranks(_nan_on_rank_one, 2, timeout=120)):
        assert message.startswith(f"MoE layer '{name}': "), (rank, message)
        assert "on rank(s) [1] of its expert-parallel group" in message, (rank, message)
        if rank == 1:
            assert "from 1 of the router's 64 weights" in message, message
