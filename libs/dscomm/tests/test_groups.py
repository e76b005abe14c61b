"""Groups of each topology, created collectively and cached, checked by reducing over them."""

import pytest
import torch
import torch.distributed as dist

import dscomm
from dscomm import PipeDataParallelTopology, PipeModelDataParallelTopology, groups
from dscomm.testing import run_ranks


def sum_over(group, rank):
    t = torch.tensor([float(rank)])
    dscomm.all_reduce(t, group=group)
    return int(t.item())


def pipe_data(rank, world):
    topo = groups.initialize(PipeDataParallelTopology(num_pp=2, num_dp=2))
    assert groups.initialize(PipeDataParallelTopology(num_pp=2, num_dp=2)) is topo  # same topology: harmless
    coord = topo.get_coord(rank)
    return {
        "dp_ranks": groups.get_group_ranks(groups.get_data_parallel_group()),
        "pp_ranks": groups.get_group_ranks(groups.get_pipeline_parallel_group()),
        "dp_sum": sum_over(groups.get_data_parallel_group(), rank),
        "pp_sum": sum_over(groups.get_pipeline_parallel_group(), rank),
        "dp_rank": groups.get_data_parallel_rank(), "pp_rank": groups.get_pipeline_parallel_rank(),
        "coord": (coord.pipe, coord.data),
        "tp_size": groups.get_tensor_parallel_world_size(),
    }


def test_pipe_data_groups_at_world_4():
    results = run_ranks(pipe_data, 4, timeout=60)
    assert [r["dp_ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["pp_ranks"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["dp_sum"] for r in results] == [1, 1, 5, 5]
    assert [r["pp_sum"] for r in results] == [2, 4, 2, 4]
    assert [(r["pp_rank"], r["dp_rank"]) for r in results] == [r["coord"] for r in results]
    assert all(r["tp_size"] == 1 for r in results)


def pipe_model_data(rank, world):
    groups.initialize(PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2))
    return (groups.get_group_ranks(groups.get_tensor_parallel_group()),
            groups.get_group_ranks(groups.get_data_parallel_group()),
            sum_over(groups.get_model_parallel_group(), rank), groups.get_model_parallel_rank(),
            (groups.get_tensor_model_parallel_rank(), groups.get_tensor_model_parallel_world_size(),
             groups.get_group_ranks(groups.get_tensor_model_parallel_group()),
             groups.get_tensor_model_parallel_src_rank()))


def test_pipe_model_data_groups_at_world_4():
    results = run_ranks(pipe_model_data, 4, timeout=60)
    assert [r[0] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # DeepSpeed's AutoTP names answer the same: rank and size in the tensor group, its ranks, its first rank
    assert [r[4] for r in results] == [(0, 2, [0, 1], 0), (1, 2, [0, 1], 0), (0, 2, [2, 3], 2), (1, 2, [2, 3], 2)]
    assert [r[1] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r[2] for r in results] == [1, 1, 5, 5]
    assert [r[3] for r in results] == [0, 1, 0, 1]


def experts(rank, world, ep_size):
    # No topology given: data parallel over the world.
    ep, edp = groups.get_expert_parallel_group(ep_size), groups.get_expert_data_parallel_group(ep_size)
    assert groups.get_expert_parallel_group(ep_size) is ep  # cached
    assert groups.get_expert_parallel_group_name(ep_size) == f"ep_size_{ep_size}"
    return (groups.get_group_ranks(ep), groups.get_group_ranks(edp), sum_over(ep, rank), sum_over(edp, rank),
            groups.get_expert_parallel_rank(ep_size), groups.get_expert_data_parallel_world_size(ep_size))


@pytest.mark.parametrize(("ep_size", "ep_lists", "edp_lists"), [
    (2, [[0, 1], [0, 1], [2, 3], [2, 3]], [[0, 2], [1, 3], [0, 2], [1, 3]]),
    (4, [[0, 1, 2, 3]] * 4, [[0], [1], [2], [3]]),
    (1, [[0], [1], [2], [3]], [[0, 1, 2, 3]] * 4),
])
def test_expert_groups(ep_size, ep_lists, edp_lists):
    results = run_ranks(experts, 4, ep_size, timeout=60)
    assert [r[0] for r in results] == ep_lists and [r[1] for r in results] == edp_lists
    assert [r[2] for r in results] == [sum(g) for g in ep_lists]
    assert [r[5] for r in results] == [len(g) for g in edp_lists]


def bad_groups(rank, world):
    messages = []
    for call in (lambda: groups.initialize(PipeDataParallelTopology(num_pp=3, num_dp=1)),
                 lambda: groups.get_expert_parallel_group(3)):
        try:
            call()
        except dscomm.CommError as exc:
            messages.append(str(exc))
    groups.initialize()
    try:
        groups.initialize(PipeDataParallelTopology(num_pp=2, num_dp=1))
    except dscomm.CommError as exc:
        messages.append(str(exc))
    return messages


def test_mismatched_topology_and_expert_size_are_named():
    messages = run_ranks(bad_groups, 2, timeout=60)[0]
    assert "= 3 ranks, but the world has 2" in messages[0]
    assert "expert-parallel size 3 must divide the data-parallel size 2; valid: [1, 2]" in messages[1]
    assert "already initialised" in messages[2]


def test_groups_need_an_initialised_world():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with pytest.raises(dscomm.CommError, match="init_distributed"):
        groups.initialize()


def deepspeed_private_expert_names(rank, world):
    groups._create_expert_and_data_parallel(2)  # DeepSpeed's name for create_expert_groups
    try:
        groups._create_expert_and_data_parallel(2, use_data_before_expert_parallel_=True)
        refused = ""
    except dscomm.CommError as exc:
        refused = str(exc)
    return (groups.get_group_ranks(groups.get_expert_parallel_group(2)),
            groups.get_group_ranks(groups.get_expert_data_parallel_group(2)),
            groups._get_expert_model_parallel_world_size(), refused)


def test_deepspeed_private_expert_names():
    results = run_ranks(deepspeed_private_expert_names, 4, timeout=60)
    assert [r[0] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r[1] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(r[2] == 1 for r in results)  # experts are never tensor-parallel
    assert "use_data_before_expert_parallel_=True" in results[0][3]


def largest_expert_group(rank, world):
    before = groups._get_max_expert_parallel_group()
    groups.create_expert_groups(2)
    groups.create_expert_groups(4)
    groups.create_expert_groups(1)
    return (before, groups.get_group_ranks(groups._get_max_expert_parallel_group()),
            groups.get_group_ranks(groups._get_data_parallel_group()))


def test_the_largest_expert_group_is_the_one_an_overflow_check_reduces_over():
    results = run_ranks(largest_expert_group, 4, timeout=60)
    assert all(r[0] is None for r in results)  # no expert groups yet
    assert all(r[1] == [0, 1, 2, 3] for r in results)  # ep 4 beats 2 and 1, whatever the order they were built in
    assert all(r[2] == [0, 1, 2, 3] for r in results)  # DeepSpeed's private name of the data-parallel group


@pytest.mark.parametrize(("world", "tp", "ep", "pp"), [(16, 2, 4, 1), (16, 2, 2, 2), (8, 1, 8, 1), (8, 1, 1, 2)])
def test_expert_rank_arithmetic_is_deepspeeds_order_of_the_groups_dims_builds(world, tp, ep, pp):
    expert, expert_data = groups._get_expert_parallel_ranks(world, tp, ep, pipeline_parallel_size_=pp)
    dims = dscomm.ParallelDims(world, pipe=pp, tensor=tp, expert=ep)
    assert sorted(expert) == sorted(dims.partition("expert"))
    assert sorted(expert_data) == sorted(dims.partition("expert_data"))
    if (world, tp, ep, pp) == (16, 2, 4, 1):  # DeepSpeed's documented example
        assert expert == [[0, 2, 4, 6], [8, 10, 12, 14], [1, 3, 5, 7], [9, 11, 13, 15]]
        assert expert_data == [[0, 8], [2, 10], [4, 12], [6, 14], [1, 9], [3, 11], [5, 13], [7, 15]]


def test_expert_rank_arithmetic_names_what_does_not_divide():
    with pytest.raises(dscomm.CommError):
        groups._get_expert_parallel_ranks(16, 2, 3)
    with pytest.raises(dscomm.CommError, match="use_data_before_expert_parallel_=True"):
        groups._get_expert_parallel_ranks(16, 2, 4, use_data_before_expert_parallel_=True)
