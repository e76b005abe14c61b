"""ParallelDims is pure arithmetic: checked for every layout of 1 to 16 ranks, without processes."""

import dataclasses

import pytest

from dscomm import GROUP_NAMES, CommError, ParallelDims, PipeDataParallelTopology, ProcessTopology


def layouts(max_world=16):
    for world in range(1, max_world + 1):
        for pipe in range(1, world + 1):
            for tensor in range(1, world // pipe + 1):
                for sequence in range(1, world // (pipe * tensor) + 1):
                    if world % (pipe * tensor * sequence):
                        continue
                    data = world // (pipe * tensor * sequence)
                    for expert in range(1, data + 1):
                        if data % expert == 0:
                            yield ParallelDims(world, pipe=pipe, tensor=tensor, expert=expert, sequence=sequence)


LAYOUTS = list(layouts())


def test_every_layout_of_up_to_16_ranks_is_covered():
    assert len(LAYOUTS) == len({dataclasses.astuple(d) for d in LAYOUTS}) > 300
    assert ParallelDims(12, pipe=2, tensor=3, expert=2) in LAYOUTS
    assert ParallelDims(16, pipe=2, tensor=2, sequence=2, expert=2) in LAYOUTS


def expected_members(dims, name, rank):
    """The group `name` of `rank` from its definition in coordinates, independent of ranks_of."""
    me = dims.coords(rank)
    same = {
        "data": lambda c: (c.pipe, c.tensor, c.sequence) == (me.pipe, me.tensor, me.sequence),
        "pipe": lambda c: (c.data, c.tensor, c.sequence) == (me.data, me.tensor, me.sequence),
        "tensor": lambda c: (c.pipe, c.data, c.sequence) == (me.pipe, me.data, me.sequence),
        "sequence": lambda c: (c.pipe, c.data, c.tensor) == (me.pipe, me.data, me.tensor),
        "sequence_data": lambda c: (c.pipe, c.tensor) == (me.pipe, me.tensor),
        "expert": lambda c: (c.pipe, c.tensor, c.sequence, c.data // dims.expert) == (
            me.pipe, me.tensor, me.sequence, me.data // dims.expert),
        "expert_data": lambda c: (c.pipe, c.tensor, c.sequence, c.data % dims.expert) == (
            me.pipe, me.tensor, me.sequence, me.data % dims.expert),
        "model": lambda c: (c.data, c.sequence) == (me.data, me.sequence),
        "norm": lambda c: True,
        "world": lambda c: True,
    }[name]
    return [r for r in range(dims.world_size) if same(dims.coords(r))]


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_layout(dims):
    world = dims.world_size
    assert dims.pipe * dims.tensor * dims.sequence * dims.data == world
    for rank in range(world):  # tensor fastest, then sequence, then data, then pipe; rank and coords are inverse
        coord = dims.coords(rank)
        assert rank == ((coord.pipe * dims.data + coord.data) * dims.sequence + coord.sequence) * dims.tensor \
            + coord.tensor
        assert dims.rank(pipe=coord.pipe, data=coord.data, tensor=coord.tensor, sequence=coord.sequence) == rank
    sizes = {"data": dims.data, "pipe": dims.pipe, "tensor": dims.tensor, "expert": dims.expert,
             "expert_data": dims.data // dims.expert, "model": dims.pipe * dims.tensor, "norm": world, "world": world,
             "sequence": dims.sequence, "sequence_data": dims.sequence * dims.data}
    for name in GROUP_NAMES:
        parts = dims.partition(name)
        assert sorted(r for part in parts for r in part) == list(range(world)), name  # a partition of the world
        assert all(len(part) == sizes[name] for part in parts), name
        for rank in range(world):
            assert dims.ranks_of(name, rank) == expected_members(dims, name, rank), (name, rank)
    topology = dims.to_topology()
    for rank in range(world):
        coord, topo = dims.coords(rank), topology.get_coord(rank)
        assert (coord.pipe, coord.data, coord.tensor) == (topo.pipe, topo.data, topo.model)
        assert coord.sequence == getattr(topo, "sequence", 0)
    assert ParallelDims.from_topology(topology, expert=dims.expert) == dims


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_pipeline_stages_and_loss_rank(dims):
    stages = [dims.stage_ranks(stage) for stage in range(dims.pipe)]
    assert sorted(r for ranks in stages for r in ranks) == list(range(dims.world_size))
    for rank in range(dims.world_size):
        coord = dims.coords(rank)
        assert rank in stages[coord.pipe]
        assert dims.is_first_stage(rank) == (coord.pipe == 0)
        assert dims.is_last_stage(rank) == (coord.pipe == dims.pipe - 1)
        loss = dims.coords(dims.loss_rank(rank))
        assert tuple(loss) == (dims.pipe - 1, coord.data, 0, coord.sequence)
        # following next_stage_rank from the first stage walks this rank's pipe group in order
        chain = [dims.ranks_of("pipe", rank)[0]]
        while dims.next_stage_rank(chain[-1]) is not None:
            chain.append(dims.next_stage_rank(chain[-1]))
        assert chain == dims.ranks_of("pipe", rank)
        assert dims.prev_stage_rank(chain[0]) is None
        assert [dims.prev_stage_rank(r) for r in chain[1:]] == chain[:-1]


def test_pipe_2_tensor_2_data_2_expert_2_by_hand():
    dims = ParallelDims(8, pipe=2, tensor=2, expert=2)
    assert dims.data == 2
    assert dims.partition("tensor") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.partition("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.partition("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.partition("model") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert dims.partition("expert") == dims.partition("data")
    assert dims.partition("expert_data") == [[r] for r in range(8)]
    assert [dims.loss_rank(r) for r in range(8)] == [4, 4, 6, 6, 4, 4, 6, 6]
    assert dims.stage_ranks(1) == [4, 5, 6, 7]
    assert str(dims) == "world 8 = pipe 2 x tensor 2 x data 2, expert 2"


def test_sequence_ranks_are_neighbours_after_the_tensor_ranks():
    # DeepSpeed's sequence-parallel groups are consecutive ranks; ZeRO's group spans data x sequence.
    dims = ParallelDims(8, sequence=2)
    assert dims.data == 4
    assert dims.partition("sequence") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.partition("data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dims.partition("sequence_data") == [list(range(8))]
    dims = ParallelDims(8, tensor=2, sequence=2)
    assert dims.partition("tensor") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.partition("sequence") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.partition("sequence_data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dims.partition("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert str(dims) == "world 8 = pipe 1 x tensor 2 x sequence 2 x data 2, expert 1"
    assert ParallelDims(4).partition("sequence") == [[0], [1], [2], [3]]
    assert ParallelDims(4).partition("sequence_data") == ParallelDims(4).partition("data")


def test_expert_groups_split_each_data_group():
    dims = ParallelDims(8, expert=2)
    assert dims.partition("expert") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.partition("expert_data") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ParallelDims(4).pipe = 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"world_size": 8, "pipe": 2, "tensor": 2, "data": 3}, "world 8 != pipe 2 x tensor 2 x data 3 = 12"),
    ({"world_size": 8, "pipe": 3}, "world 8 is not a multiple of pipe 3 x tensor 1 = 3; pipe x tensor must be "
                                   "one of: 1, 2, 4, 8"),
    ({"world_size": 12, "pipe": 2, "tensor": 4}, "world 12 is not a multiple of pipe 2 x tensor 4 = 8"),
    ({"world_size": 4, "expert": 3}, "expert 3 does not divide data 4; valid: 1, 2, 4"),
    ({"world_size": 12, "tensor": 2, "expert": 4}, "expert 4 does not divide data 6; valid: 1, 2, 3, 6"),
    ({"world_size": 0}, "world_size=0"),
    ({"world_size": 4, "pipe": 0}, "pipe=0"),
    ({"world_size": 4, "tensor": -2}, "tensor=-2"),
    ({"world_size": 4, "data": 0}, "data=0"),
    ({"world_size": 4, "expert": 0}, "expert=0"),
    ({"world_size": 4, "sequence": 0}, "sequence=0"),
    ({"world_size": 6, "sequence": 4}, "world 6 is not a multiple of pipe 1 x tensor 1 x sequence 4 = 4; pipe x tensor "
                                       "x sequence must be one of: 1, 2, 3, 6"),
    ({"world_size": 8, "sequence": 2, "data": 2}, "world 8 != pipe 1 x tensor 1 x sequence 2 x data 2 = 4"),
    ({"world_size": 4, "pipe": True}, "pipe=True"),
    ({"world_size": 4, "tensor": 2.0}, "tensor=2.0"),
    ({"world_size": "4"}, "world_size='4'"),
])
def test_invalid_layouts_name_every_factor(kwargs, message):
    with pytest.raises(CommError, match="ParallelDims") as caught:
        ParallelDims(**kwargs)
    assert message in str(caught.value)
    if "positive integer" in str(caught.value):  # the whole layout is printed too
        assert "world " in str(caught.value) and "expert " in str(caught.value)


@pytest.mark.parametrize(("call", "message"), [
    (lambda d: d.coords(8), r"rank 8 is outside 0..7 \(world 8 = pipe 2 x tensor 2 x data 2, expert 1\)"),
    (lambda d: d.coords(-1), "rank -1 is outside"),
    (lambda d: d.rank(pipe=2), r"pipe=2 is outside 0..1"),
    (lambda d: d.rank(tensor=-1), r"tensor=-1 is outside 0..1"),
    (lambda d: d.rank(data=1.0), r"data=1.0 is outside"),
    (lambda d: d.ranks_of("experts", 0), "no group named 'experts'; the groups are data, pipe, tensor"),
    (lambda d: d.stage_ranks(2), "pipe=2 is outside"),
    (lambda d: ParallelDims.from_topology(ProcessTopology(["data", "pipe"], [2, 2])), "not a subsequence"),
])
def test_bad_queries_are_named(call, message):
    with pytest.raises(CommError, match=message):
        call(ParallelDims(8, pipe=2, tensor=2))


def test_from_deepspeed_topologies():
    assert ParallelDims.from_topology(PipeDataParallelTopology(num_pp=2, num_dp=3)) == ParallelDims(6, pipe=2)
    assert ParallelDims.from_topology(ProcessTopology(["data"], [5]), expert=5) == ParallelDims(5, expert=5)
