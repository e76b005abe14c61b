"""ParallelDims.build() on real gloo ranks: each group holds the ranks the layout says, and a reduction
over it sums exactly its members; DeepSpeed's getters follow whatever layout is registered."""

import pytest
import torch
import torch.distributed as dist

import dscomm
from dscomm import GROUP_NAMES, ParallelDims, groups
from dscomm.testing import run_ranks


def member_sum(group, rank):
    """Sum of 2**rank over the group: the bits name exactly the ranks that took part."""
    t = torch.tensor([float(2 ** rank)], dtype=torch.float64)
    dscomm.all_reduce(t, group=group)
    return [r for r in range(64) if int(t.item()) >> r & 1]


def build_and_reduce(rank, world, layout):
    built = ParallelDims(world, **layout).build()
    report = {}
    for name in GROUP_NAMES:
        group = getattr(built, name)
        assert group is built.group(name)
        report[name] = {"ranks": built.ranks(name), "torch_ranks": dist.get_process_group_ranks(group),
                        "summed": member_sum(group, rank), "size": built.size(name), "rank_in": built.rank_in(name)}
    report["stage"], report["loss_rank"] = built.stage, built.loss_rank
    # groups of the same ranks are one process group; the whole world is torch's default group
    report["shared"] = (built.expert is built.data, built.norm is built.world is dist.group.WORLD)
    report["neighbours"] = (built.prev_stage_rank, built.next_stage_rank, built.is_first_stage, built.is_last_stage)
    report["tensor_mpu"] = (built.get_tensor_model_parallel_rank(), built.get_tensor_model_parallel_world_size(),
                            built.get_tensor_model_parallel_group() is built.tensor)
    return report


def check(results, dims):
    for rank, report in enumerate(results):
        for name in GROUP_NAMES:
            expected = dims.ranks_of(name, rank)
            got = report[name]
            assert got["ranks"] == got["torch_ranks"] == got["summed"] == expected, (rank, name, got)
            assert got["size"] == len(expected) and got["rank_in"] == expected.index(rank)
        assert report["stage"] == dims.coords(rank).pipe and report["loss_rank"] == dims.loss_rank(rank)
        assert report["neighbours"] == (dims.prev_stage_rank(rank), dims.next_stage_rank(rank),
                                        dims.is_first_stage(rank), dims.is_last_stage(rank))
        assert report["tensor_mpu"] == (dims.coords(rank).tensor, dims.tensor, True)


def test_pipe_2_by_data_2_at_world_4():
    dims = ParallelDims(4, pipe=2, expert=2)
    results = run_ranks(build_and_reduce, 4, {"pipe": 2, "expert": 2}, timeout=90)
    check(results, dims)
    assert [r["data"]["ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["pipe"]["ranks"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["loss_rank"] for r in results] == [2, 3, 2, 3]
    assert all(r["shared"] == (True, True) for r in results)  # expert 2 = data 2 here


def test_pipe_2_by_tensor_2_by_data_2_with_expert_2_at_world_8():
    dims = ParallelDims(8, pipe=2, tensor=2, expert=2)
    results = run_ranks(build_and_reduce, 8, {"pipe": 2, "tensor": 2, "expert": 2}, timeout=120)
    check(results, dims)
    assert [r["model"]["ranks"] for r in results][:3] == [[0, 1, 4, 5], [0, 1, 4, 5], [2, 3, 6, 7]]


def sequence_layout(rank, world):
    built = ParallelDims(world, sequence=2).build()
    groups.use(built)
    report = {"mpu": (built.get_sequence_parallel_rank(), built.get_sequence_parallel_world_size(),
                      built.get_sequence_parallel_group() is built.sequence,
                      built.get_sequence_data_parallel_rank(), built.get_sequence_data_parallel_world_size(),
                      built.get_sequence_data_parallel_group() is built.sequence_data),
              # DeepSpeed's scripts call the underscored getters of deepspeed.utils.groups
              "getters": (groups.get_group_ranks(groups._get_sequence_parallel_group()),
                          groups._get_sequence_parallel_world_size(), groups._get_sequence_parallel_rank(),
                          groups.get_group_ranks(groups._get_sequence_data_parallel_group()),
                          groups._get_sequence_data_parallel_world_size(), groups._get_sequence_data_parallel_rank()),
              "sequence_sum": member_sum(built.sequence, rank), "data_sum": member_sum(built.data, rank),
              "topology": str(built.topology)}
    return report


def test_sequence_2_by_data_2_at_world_4():
    dims = ParallelDims(4, sequence=2)
    check(run_ranks(build_and_reduce, 4, {"sequence": 2}, timeout=90), dims)
    results = run_ranks(sequence_layout, 4, timeout=90)
    for rank, report in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        assert report["mpu"] == (rank % 2, 2, True, rank, 4, True)
        assert report["getters"] == (pair, 2, rank % 2, [0, 1, 2, 3], 4, rank)
        assert report["sequence_sum"] == pair and report["data_sum"] == [rank % 2, rank % 2 + 2]
        assert report["topology"] == "ProcessTopology({'pipe': 1, 'data': 2, 'sequence': 2, 'model': 1})"


def getters_follow_the_registry(rank, world):
    def answers():
        return {"data": (groups.get_group_ranks(groups.get_data_parallel_group()),
                         groups.get_data_parallel_world_size(), groups.get_data_parallel_rank()),
                "pipe": (groups.get_group_ranks(groups.get_pipeline_parallel_group()),
                         groups.get_pipeline_parallel_world_size(), groups.get_pipeline_parallel_rank()),
                "tensor": (groups.get_group_ranks(groups.get_model_parallel_group()),
                           groups.get_tensor_parallel_world_size(), groups.get_model_parallel_rank()),
                "expert2": (groups.get_group_ranks(groups.get_expert_parallel_group(2)),
                            groups.get_group_ranks(groups.get_expert_data_parallel_group(2)),
                            groups.get_expert_parallel_rank(2), groups.get_expert_data_parallel_world_size(2)),
                "sequence": (groups.get_sequence_parallel_world_size(), groups.get_sequence_parallel_rank(),
                             groups.get_group_ranks(groups.get_sequence_data_parallel_group())),
                "data_sum": member_sum(groups.get_data_parallel_group(), rank),
                "pipe_sum": member_sum(groups.get_pipeline_parallel_group(), rank),
                "topology": str(groups.get_topology())}

    seen = {"unregistered": answers(), "still_unregistered": groups.current() is None}
    pipe2 = ParallelDims(world, pipe=2).build()
    groups.use(pipe2)
    seen["pipe2"] = answers()
    seen["current_is_pipe2"] = groups.current() is pipe2
    groups.use(ParallelDims(world, tensor=2, expert=2).build())  # a later, different layout takes over
    seen["tensor2"] = answers()
    seen["expert_is_registered"] = groups.get_expert_parallel_group(2) is groups.current().expert
    dscomm.destroy()  # forgets the registry with the world
    seen["after_destroy"] = groups.current() is None
    return seen


def test_getters_answer_data_parallel_then_follow_each_registered_layout():
    results = run_ranks(getters_follow_the_registry, 4, timeout=90)
    for rank, seen in enumerate(results):
        assert seen["still_unregistered"] and seen["current_is_pipe2"] and seen["after_destroy"]
        assert seen["expert_is_registered"]
        unregistered = seen["unregistered"]
        assert unregistered["data"] == ([0, 1, 2, 3], 4, rank)
        assert unregistered["pipe"] == unregistered["tensor"] == ([rank], 1, 0)
        assert unregistered["sequence"] == (1, 0, [0, 1, 2, 3])  # no sequence parallelism: ZeRO's group is data
        assert seen["pipe2"]["sequence"] == (1, 0, seen["pipe2"]["data"][0])
        assert unregistered["data_sum"] == [0, 1, 2, 3] and unregistered["pipe_sum"] == [rank]
        assert unregistered["expert2"] == ([0, 1] if rank < 2 else [2, 3], [rank % 2, rank % 2 + 2], rank % 2, 2)
        assert unregistered["topology"] == "ProcessTopology({'data': 4})"
        pipe2 = seen["pipe2"]
        assert pipe2["data"] == ([0, 1] if rank < 2 else [2, 3], 2, rank % 2)
        assert pipe2["pipe"] == ([rank % 2, rank % 2 + 2], 2, rank // 2)
        assert pipe2["tensor"] == ([rank], 1, 0)
        assert pipe2["expert2"] == (pipe2["data"][0], [rank], rank % 2, 1)  # ep 2 within each data group of 2
        assert pipe2["data_sum"] == pipe2["data"][0] and pipe2["pipe_sum"] == pipe2["pipe"][0]
        assert pipe2["topology"] == "ProcessTopology({'pipe': 2, 'data': 2, 'model': 1})"
        tensor2 = seen["tensor2"]
        assert tensor2["data"] == ([rank % 2, rank % 2 + 2], 2, rank // 2)
        assert tensor2["tensor"] == ([0, 1] if rank < 2 else [2, 3], 2, rank % 2)
        assert tensor2["pipe"] == ([rank], 1, 0)
        assert tensor2["expert2"] == (tensor2["data"][0], [rank], rank // 2, 1)


def bad_uses(rank, world):
    messages = []
    for call in (lambda: groups.use("data"), lambda: ParallelDims(world * 2).build(),
                 lambda: groups.get_expert_parallel_group(3)):
        try:
            call()
        except dscomm.CommError as exc:
            messages.append(str(exc))
    return messages


def test_bad_layouts_and_registrations_are_named():
    messages = run_ranks(bad_uses, 2, timeout=60)[0]
    assert "use takes the ParallelGroups of ParallelDims(...).build(), got str" in messages[0]
    assert "the layout is for 4 ranks (world 4 = pipe 1 x tensor 1 x data 4, expert 1) but the world has 2" in messages[1]
    assert "expert-parallel size 3 must divide the data-parallel size 2; valid: [1, 2]" in messages[2]


def test_build_needs_an_initialised_world():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with pytest.raises(dscomm.CommError, match="init_distributed"):
        ParallelDims(1).build()
    with pytest.raises(dscomm.CommError, match="init_distributed"):
        groups.get_data_parallel_group()
