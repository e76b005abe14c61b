"""DeepSpeed's parameter-group helpers: expert parameters in groups of their own, tagged for ZeRO."""

import importlib.metadata

import pytest
import torch
from moe_models import HIDDEN, mlp

import dsmoe
from dscomm import EXPERT_PARAM_GROUP_TAG
from dsmoe import MoE, MoEError, is_moe_param, split_params_into_different_moe_groups_for_optimizer


def model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"pre": torch.nn.Linear(HIDDEN, HIDDEN),
                                "a": MoE(HIDDEN, mlp(), num_experts=4, ep_size=2),
                                "b": MoE(HIDDEN, mlp(), num_experts=2, ep_size=1)})


def test_expert_parameters_move_to_tagged_groups_per_expert_group_name():
    net = model()
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters()), "name": "d",
                                                                  "lr": 0.1, "weight_decay": 0.0})
    assert [g["name"] for g in groups] == ["d", "ep_size_2", "ep_size_1"]  # in parameter order, on every rank
    assert [bool(g.get(EXPERT_PARAM_GROUP_TAG)) for g in groups] == [False, True, True]
    assert all(g["lr"] == 0.1 and g["weight_decay"] == 0.0 for g in groups)
    assert not any(is_moe_param(p) for p in groups[0]["params"])
    expert_a = {id(p) for p in net["a"].deepspeed_moe.experts.parameters()}
    assert {id(p) for p in groups[1]["params"]} == expert_a
    assert len(groups[0]["params"]) == 4  # pre.weight, pre.bias and the two gates
    total = sum(p.numel() for g in groups for p in g["params"])
    assert total == sum(p.numel() for p in net.parameters())


def test_max_group_size_cuts_expert_groups():
    net = model()
    per_expert = sum(p.numel() for p in net["b"].deepspeed_moe.experts.deepspeed_experts[0].parameters())
    groups = split_params_into_different_moe_groups_for_optimizer([{"params": list(net["b"].parameters()),
                                                                    "name": "x"}], max_group_size=per_expert)
    assert [g["name"] for g in groups] == ["x", "ep_size_1", "ep_size_1"]
    assert all(sum(p.numel() for p in g["params"]) <= per_expert for g in groups[1:])


def test_configure_moe_param_groups_as_deepspeeds_engine():
    net = model()
    groups = dsmoe.configure_moe_param_groups(net.parameters())
    assert groups[0]["name"] == "dense-params" and len(groups) == 3
    assert dsmoe.configure_moe_param_groups(groups) is not None
    kept = dsmoe.configure_moe_param_groups(groups)
    assert [g["name"] for g in kept] == [g["name"] for g in groups]  # already split: unchanged
    assert dsmoe.has_moe_layers(net) == (True, 4)
    assert [name for name, _ in dsmoe.moe_layers(net)] == ["a", "b"]
    with pytest.raises(MoEError, match="tensors or parameter-group dicts"):
        dsmoe.configure_moe_param_groups([1.0])


def test_version_and_public_api():
    assert dsmoe.__version__ == importlib.metadata.version("dsmoe")
    for name in dsmoe.__all__:
        assert hasattr(dsmoe, name), name
    assert issubclass(MoEError, ValueError)
    from dsmoe.layer import MoE as layer_moe
    from dsmoe.sharded_moe import TopKGate, top1gating
    from dsmoe.utils import split_params_into_different_moe_groups_for_optimizer as split

    assert layer_moe is MoE and callable(top1gating) and TopKGate and split
