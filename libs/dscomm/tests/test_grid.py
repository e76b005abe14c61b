"""PipelineParallelGrid (DeepSpeed's pipeline grid) over 4 gloo ranks, and prime_factors."""

import pytest
import torch
import torch.distributed as dist

from dscomm import CommError
from dscomm.grid import PipelineParallelGrid, prime_factors
from dscomm.testing import run_ranks
from dscomm.topology import ProcessTopology


def _grid(rank, world):
    grid = PipelineParallelGrid(ProcessTopology(axes=["pipe", "data"], dims=[2, 2]))
    sums = []
    for group in (grid.get_pipe_parallel_group(), grid.get_data_parallel_group()):
        value = torch.tensor([rank])
        dist.all_reduce(value, group=group)
        sums.append(int(value))
    default = PipelineParallelGrid()  # 4 = 2 x 2: pipe 2, data 2 from the prime factors
    try:
        PipelineParallelGrid(ProcessTopology(axes=["pipe", "data"], dims=[2, 3]))
    except CommError as exc:
        refused = str(exc)
    return {"stage": grid.get_stage_id(), "data": grid.get_data_parallel_id(), "first": grid.is_first_stage,
            "last": grid.is_last_stage, "pp": grid.pp_group, "dp": grid.dp_group, "sums": sums,
            "to_global": [grid.stage_to_global(stage_id=s) for s in (0, 1)],
            "explicit": grid.stage_to_global(stage_id=1, data=0), "p2p": grid.p2p_groups[rank],
            "model": (grid.get_model_parallel_rank(), grid.get_model_parallel_world_size()),
            "default": (default.pipe_parallel_size, default.data_parallel_size), "refused": refused}


def test_grid_places_each_rank_and_its_groups_reduce_along_their_axis():
    results = run_ranks(_grid, 4, timeout=120)
    for rank, got in enumerate(results):
        stage, data = divmod(rank, 2)  # row-major: data varies fastest
        assert (got["stage"], got["data"], got["first"], got["last"]) == (stage, data, stage == 0, stage == 1)
        assert got["pp"] == [data, data + 2] and got["dp"] == [2 * stage, 2 * stage + 1]
        assert got["sums"] == [sum(got["pp"]), sum(got["dp"])]
        assert got["to_global"] == [data, data + 2] and got["explicit"] == 2
        assert got["p2p"] == [rank, (rank + 2) % 4]
        assert got["model"] == (stage, 2)  # a model replica is the ranks of one data index: its two stages
        assert got["default"] == (2, 2)
        assert "the topology has 6 ranks" in got["refused"] and "the world has 4" in got["refused"]


def test_prime_factors():
    assert [prime_factors(n) for n in (1, 2, 12, 29, 30)] == [[], [2], [2, 2, 3], [29], [2, 3, 5]]
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="is not a positive integer"):
            prime_factors(bad)
