"""A ZeRO checkpoint parameter by parameter (what tensor parallelism needs to merge and re-cut weights and
Adam's moments at another degree): read_parameter_states gives every parameter's fp32 master and optimizer
state whole; load_parameter_states cuts them into any stage's layout at any world size (round trip exact)."""

import pytest
import torch
from torch import nn

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig
from dszero.checkpoint import load_parameter_states, read_parameter_states


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def trained_save(rank, world, directory):
    net = model()
    zero = dszero.ZeroOptimizer(net, torch.optim.AdamW(net.parameters(), lr=0.1), ZeroConfig(stage=2),
                                precision="fp64")
    for step in range(3):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(10 * step + rank), dtype=torch.float64)
        zero.backward(net(x).pow(2).mean())
        zero.step()
    zero.save(directory)


def reload_and_save(rank, world, source, target, stage):
    net = model()
    zero = dszero.ZeroOptimizer(net, torch.optim.AdamW(net.parameters(), lr=0.1), ZeroConfig(stage=stage),
                                precision="fp64")
    states, scalars = read_parameter_states(source)
    load_parameter_states(zero, states, scalars)
    zero.save(target)
    with dszero.GatheredParameters(list(net.parameters())):
        return {name: p.detach().clone() for name, p in net.named_parameters()}


@pytest.mark.parametrize(("world", "stage"), [(1, 0), (2, 3)])
def test_parameter_states_round_trip_into_another_layout(world, stage, tmp_path):
    run_ranks(trained_save, 2, str(tmp_path / "a"), timeout=120)
    saved, scalars = read_parameter_states(tmp_path / "a")
    assert set(saved["0.weight"]) == {"master", "exp_avg", "exp_avg_sq"} and scalars["step"] == 3
    assert torch.equal(saved["0.weight"]["master"].float(),  # zero_to_fp32 gives the same values, in fp32
                       dszero.get_fp32_state_dict_from_zero_checkpoint(tmp_path / "a")["0.weight"])
    weights = run_ranks(reload_and_save, world, str(tmp_path / "a"), str(tmp_path / "b"), stage, timeout=120)[0]
    again, again_scalars = read_parameter_states(tmp_path / "b")
    assert again_scalars["step"] == 3
    for name, kinds in saved.items():
        assert torch.equal(weights[name], kinds["master"].double())
        for kind, value in kinds.items():
            assert torch.equal(again[name][kind].double(), value.double()), (name, kind)


def test_a_parameter_missing_from_the_states_is_named(tmp_path):
    run_ranks(trained_save, 2, str(tmp_path / "a"), timeout=120)

    def load_partial(rank, world):
        net = model()
        zero = dszero.ZeroOptimizer(net, torch.optim.AdamW(net.parameters()), ZeroConfig(stage=1), precision="fp64")
        states, scalars = read_parameter_states(tmp_path / "a")
        del states["2.bias"]
        try:
            load_parameter_states(zero, states, scalars)
        except dszero.CheckpointError as exc:
            return str(exc)
    assert "2.bias" in run_ranks(load_partial, 1, timeout=60)[0]
