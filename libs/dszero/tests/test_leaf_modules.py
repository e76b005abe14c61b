"""ZeRO-3 leaf modules (set_z3_leaf_modules): a module calling a different child on each rank trains as one
process does, its parameters gathered together at its forward."""

import copy

import pytest
import torch

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig
from dszero.leaf_modules import (
    get_z3_leaf_modules,
    set_z3_leaf_modules,
    set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix,
    unset_z3_leaf_modules,
    z3_leaf_module,
    z3_leaf_parameter,
)


class Routed(torch.nn.Module):
    """Calls one of its experts, chosen by the caller: as an MoE block routes, differently on each rank."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(2))

    def forward(self, x, expert):
        return self.experts[expert](x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(4, 6)
        self.block = Routed()
        self.out = torch.nn.Linear(6, 1)

    def forward(self, x, expert):
        return self.out(self.block(self.inp(x), expert)).square().mean()


def _batch(rank):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + rank))


def leaf_trains_as_one_process(rank, world):
    model = Model()
    reference = copy.deepcopy(model)
    marked = set_z3_leaf_modules(model, [Routed])
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), ZeroConfig(stage=3))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        zero.backward(model(_batch(rank), expert=rank))  # rank r calls only expert r
        zero.step()
        ref_opt.zero_grad()
        (sum(reference(_batch(r), expert=r) for r in range(world)) / world).backward()
        ref_opt.step()
    with dszero.GatheredParameters(list(model.parameters())):
        trained = {name: p.detach().clone() for name, p in model.named_parameters()}
    expected = dict(reference.named_parameters())
    return ([m is model.block for m in marked], z3_leaf_parameter(model.block.experts[1].weight),
            {name: (trained[name] - expected[name]).abs().max().item() for name in trained})


def test_leaf_module_calling_a_different_child_on_each_rank_trains_as_one_process():
    for marked, leaf_param, diffs in run_ranks(leaf_trains_as_one_process, 2, timeout=90):
        assert marked == [True] and leaf_param
        assert max(diffs.values()) < 1e-6, diffs


def test_marking_by_class_name_and_suffix_and_what_is_refused():
    model = Model()
    assert [m for m in set_z3_leaf_modules(model, ["Routed"])] == [model.block] and z3_leaf_module(model.block)
    assert get_z3_leaf_modules(model) == [model.block]
    unset_z3_leaf_modules(model, [f"{Routed.__module__}.Routed"])
    assert get_z3_leaf_modules(model) == []
    marked, missing = set_z3_leaf_modules_by_suffix(model, ["experts.1", "nothing"], raise_if_not_found=False)
    assert marked == [model.block.experts[1]] and missing == ["nothing"]
    marked, missing = set_z3_leaf_modules_by_name(model, ["block"])
    assert marked == [model.block] and missing == []
    with pytest.raises(ValueError, match=r"No modules named \['blok'\]"):
        set_z3_leaf_modules_by_name(model, ["blok"])
    with pytest.raises(ValueError, match="No modules of type"):
        set_z3_leaf_modules(model, [torch.nn.Conv2d])
    with pytest.raises(dszero.ZeroConfigError, match="module classes or class names"):
        set_z3_leaf_modules(model, [3])


def leaf_from_config_trains_as_one_process(rank, world, leaf_module):
    import dsconfig

    model = Model()
    reference = copy.deepcopy(model)
    config = dsconfig.load({"train_batch_size": world, "zero_optimization": {"stage": 3, "leaf_module": leaf_module}})
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), config.zero_optimization)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    zero.backward(model(_batch(rank), expert=rank))  # without the leaf, the ranks would wait on each other's gather
    zero.step()
    (sum(reference(_batch(r), expert=r) for r in range(world)) / world).backward()
    ref_opt.step()
    with dszero.GatheredParameters(list(model.parameters())):
        trained = {name: p.detach().clone() for name, p in model.named_parameters()}
    expected = dict(reference.named_parameters())
    return get_z3_leaf_modules(model) == [model.block], max((trained[n] - expected[n]).abs().max().item()
                                                             for n in trained)


@pytest.mark.parametrize("leaf_module", [{"classes": "Routed"}, {"names": ["block"]}, {"name_suffixes": "ock"}])
def test_zero_optimization_leaf_module_marks_the_config_s_modules(leaf_module):
    for only_block, diff in run_ranks(leaf_from_config_trains_as_one_process, 2, leaf_module, timeout=90):
        assert only_block and diff < 1e-6


def test_a_leaf_module_name_that_matches_nothing_is_warned_about():
    import dsconfig
    from dszero.leaf_modules import apply_leaf_module_config

    config = dsconfig.load({"train_batch_size": 1, "zero_optimization": {"leaf_module": {"names": ["blok"]}}})
    with pytest.warns(UserWarning, match=r"leaf_module.names: \['blok'\] match no module of Model"):
        assert apply_leaf_module_config(Model(), config.zero_optimization.leaf_module) == []
    defaults = dsconfig.load({"train_batch_size": 1}).zero_optimization.leaf_module
    assert "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock" in defaults.classes
    assert apply_leaf_module_config(Model(), defaults) == []  # Hugging Face's MoE blocks: absent here, no warning
