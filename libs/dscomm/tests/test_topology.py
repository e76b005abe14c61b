"""Topologies are pure arithmetic: coordinates, ranks and communicator lists, tested without processes."""

import pytest

from dscomm import CommError, PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology


def test_rank_and_coord_are_inverse_row_major():
    topo = ProcessTopology(axes=["a", "b", "c"], dims=[2, 3, 4])
    assert topo.world_size() == 24
    for rank in range(24):
        coord = topo.get_coord(rank)
        assert topo.get_rank(**coord._asdict()) == rank
        assert rank == coord.a * 12 + coord.b * 4 + coord.c   # last axis fastest
    assert topo.get_coord(5)._fields == ("a", "b", "c")


def test_pipe_data_topology():
    topo = PipeDataParallelTopology(num_pp=2, num_dp=4)
    assert topo.get_axis_names() == ["pipe", "data"]
    assert topo.get_axis_comm_lists("data") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.filter_match(pipe=1) == [4, 5, 6, 7]
    assert topo.get_axis_list("data", 2) == [2, 6]
    assert topo.get_dim("model") == 0 and topo.get_axis_comm_lists("model") == []


def test_pipe_model_data_topology_keeps_tensor_peers_adjacent():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_names() == ["pipe", "data", "model"]
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.filter_match(pipe=0, model=1) == [1, 3]
    assert topo.get_coord(7) == topo.ProcessCoord(pipe=1, data=1, model=1)
    assert topo.get_rank_repr(3) == "model_01"


def test_every_rank_is_in_exactly_one_list_per_axis():
    topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[3, 2, 2])
    for axis in topo.axes:
        flat = sorted(r for group in topo.get_axis_comm_lists(axis) for r in group)
        assert flat == list(range(12))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ProcessTopology(["a", "b"], [2]), "one size per axis"),
    (lambda: ProcessTopology(["a", "a"], [2, 2]), "unique"),
    (lambda: ProcessTopology(["a"], [0]), "positive integer"),
    (lambda: PipeDataParallelTopology(2, 2).get_rank(pipe=2, data=0), "pipe=2 is outside 0..1"),
    (lambda: PipeDataParallelTopology(2, 2).get_rank(pipe=0), "exactly the axes"),
    (lambda: PipeDataParallelTopology(2, 2).get_coord(4), "outside this topology"),
    (lambda: PipeDataParallelTopology(2, 2).filter_match(model=0), "unknown axes"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(CommError, match=message):
        call()
