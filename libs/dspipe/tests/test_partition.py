"""Stage boundaries without processes: DeepSpeed's partition_uniform / partition_balanced boundaries,
the partition methods, and a PipelineModule in a world of one."""

import pytest
import torch
from torch import nn

import dscomm
from dspipe import DualPipeVModule, LayerSpec, PipelineError, PipelineModule, TiedLayerSpec
from dspipe.partition import partition_balanced, partition_uniform, prefix_sum_inc

# Boundaries computed with deepspeed.runtime.utils (0.19) for these inputs: the spread between the
# heaviest and the lightest part is minimised, ties moving the last cut as late as possible.
DEEPSPEED_BALANCED = [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [0, 5, 7, 9]),
    ([5, 1, 1, 1, 1, 5], 2, [0, 3, 6]),
    ([0, 0, 0, 4, 0, 0], 3, [0, 4, 5, 6]),
    ([3, 3, 3, 3], 4, [0, 1, 2, 3, 4]),
    ([1, 1, 1, 1, 1, 1, 1], 3, [0, 3, 5, 7]),
    ([10, 1, 1, 1, 1, 1, 1, 1, 1, 10], 4, [0, 1, 5, 9, 10]),
    ([2, 2], 3, [0, 1, 2, 2]),
    ([0, 1, 0, 1, 0, 1, 0, 1], 2, [0, 5, 8]),
    ([1.5, 0.25, 2.0, 0.75, 1.0], 2, [0, 3, 5]),
]


@pytest.mark.parametrize(("weights", "parts", "expected"), DEEPSPEED_BALANCED)
def test_partition_balanced_gives_deepspeeds_boundaries(weights, parts, expected):
    assert partition_balanced(weights, parts) == expected


@pytest.mark.parametrize(("items", "parts", "expected"), [
    (10, 3, [0, 4, 7, 10]), (9, 3, [0, 3, 6, 9]), (2, 4, [0, 1, 2, 2, 2]), (0, 2, [0, 0, 0]), (7, 1, [0, 7]),
])
def test_partition_uniform_gives_deepspeeds_boundaries(items, parts, expected):
    assert partition_uniform(items, parts) == expected


def test_bad_counts_are_refused_by_name():
    with pytest.raises(PipelineError, match="num_parts must be an int >= 1, got 0"):
        partition_uniform(3, 0)
    with pytest.raises(PipelineError, match="num_items must be an int >= 0"):
        partition_uniform(-1, 2)


def solo(layers, **kwargs):
    """A module in a world of one that holds all layers but reports the boundaries of `stages` stages."""
    return PipelineModule(layers, topology=dscomm.ParallelDims(1), **kwargs)


def boundaries(layers, stages, method, **kwargs):
    from dspipe.partition import partition_layers

    module = solo(layers, partition_method="uniform", **kwargs)
    return partition_layers(module._layer_specs, stages, method, parameter_counts=module._count_layer_params,
                            profile_times=lambda: pytest.fail("not profiled"))


def test_methods_balance_parameters_layer_types_or_layer_counts():
    layers = [LayerSpec(nn.Linear, 4, 4), nn.ReLU(), LayerSpec(nn.Linear, 4, 40), LayerSpec(nn.Linear, 40, 4), nn.ReLU()]
    # parameters: 20, 0, 200, 164, 0 -> the two big layers apart
    assert boundaries(layers, 2, "parameters") == [0, 3, 5]
    assert boundaries(layers, 2, "uniform") == [0, 3, 5]
    assert boundaries(layers, 3, "uniform") == [0, 2, 4, 5]
    assert boundaries(layers, 2, "type:relu") == [0, 4, 5]  # one ReLU each, the cut as late as it goes
    assert boundaries(layers, 2, "TYPE:Linear") == [0, 3, 5]
    with pytest.raises(PipelineError, match="matches no layer; the layers' class names are: Linear, ReLU"):
        boundaries(layers, 2, "type:conv")
    with pytest.raises(PipelineError, match="'best' is not known; valid: parameters, uniform, type:<regex>, profile"):
        boundaries(layers, 2, "best")


def test_profile_times_each_layer_on_the_sample_and_balances_them():
    class Slow(nn.Module):
        def __init__(self, reps):
            super().__init__()
            self.reps = reps
            self.lin = nn.Linear(32, 32)

        def forward(self, x):
            for _ in range(self.reps):
                x = torch.tanh(self.lin(x))
            return x

    layers = [LayerSpec(Slow, 1), LayerSpec(Slow, 1), LayerSpec(Slow, 1), LayerSpec(Slow, 200)]
    module = solo(layers, partition_method="profile", sample_input=torch.randn(64, 32))
    assert module.partitions() == [0, 4]  # one stage in a world of one
    from dspipe.profiling import profile_layer_times

    times = profile_layer_times(layers, torch.randn(64, 32), "profile")
    assert times[3] > 3 * max(times[:3])
    assert partition_balanced(times, 2) == [0, 3, 4]  # parameters would have cut [0, 2, 4]
    with pytest.raises(PipelineError, match=r"pass PipelineModule\(\.\.\., sample_input="):
        solo(layers, partition_method="profile")


def test_a_world_of_one_builds_every_layer_with_deepspeeds_names():
    torch.manual_seed(0)
    layers = [LayerSpec(nn.Linear, 3, 3), torch.tanh, TiedLayerSpec("emb", nn.Linear, 3, 3),
              TiedLayerSpec("emb", nn.Linear, 3, 3, forward_fn=lambda m, x: x @ m.weight)]
    module = PipelineModule(layers, num_stages=1, partition_method="uniform")
    assert sorted(n for n, _ in module.named_parameters()) == ["0.bias", "0.weight", "tied_modules.emb.bias",
                                                               "tied_modules.emb.weight"]
    assert module.stage_owner(3) == 0 and module.num_pipeline_stages() == 1
    assert module(torch.ones(2, 3)).shape == (2, 3)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(PipelineError, match=r"num_stages=2 must divide the world size 1 .*init_distributed"):
        PipelineModule([nn.Linear(2, 2)] * 2, num_stages=2)
    with pytest.raises(PipelineError, match="needs num_stages= or topology"):
        PipelineModule([nn.Linear(2, 2)])
    with pytest.raises(PipelineError, match=r"LayerSpec takes a torch\.nn\.Module subclass"):
        LayerSpec(int)
    with pytest.raises(PipelineError, match="layers is empty"):
        PipelineModule([], num_stages=1)
    with pytest.raises(PipelineError, match="layer 1 is a int"):
        PipelineModule([nn.Linear(2, 2), 3], num_stages=1)
    with pytest.raises(PipelineError, match="chunks must stay 1"):
        DualPipeVModule([nn.Linear(2, 2)] * 2, num_stages=1, chunks=2)
    with pytest.raises(PipelineError, match="has no attribute 'weigth'"):
        PipelineModule([TiedLayerSpec("a", nn.Linear, 2, 2, tied_weight_attr="weigth")], num_stages=1)


def test_inclusive_prefix_sums():
    assert prefix_sum_inc([3, 4, 5]) == [3, 7, 12]
    assert prefix_sum_inc([]) == [] and prefix_sum_inc([0.5, 0.25]) == [0.5, 0.75]
