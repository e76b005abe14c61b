"""A pipeline grid: this rank's place in a pipe x data (x model) topology and the process groups along each
axis (DeepSpeed's PipelineParallelGrid, which Megatron-style code and pipeline engines are handed as `mpu`).

Every rank builds the grid together: the groups of each axis are created in one order on all ranks, as
torch.distributed requires of new_group.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .errors import CommError
from .parallel_groups import new_group
from .topology import PipeDataParallelTopology, ProcessTopology


def prime_factors(number: int) -> list[int]:
    """The prime factors of a positive integer, smallest first, with repeats (12 -> [2, 2, 3]; 1 -> [])."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"prime_factors: {number!r} is not a positive integer")
    factors, divisor = [], 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            factors.append(divisor)
            number //= divisor
        divisor += 1
    return factors + ([number] if number > 1 else [])


def _default_topology(world: int) -> ProcessTopology:
    # No topology given: the world's prime factors dealt alternately to pipe and data (DeepSpeed's default).
    pipe = data = 1
    for index, prime in enumerate(prime_factors(world)):
        if index % 2 == 0:
            pipe *= prime
        else:
            data *= prime
    return PipeDataParallelTopology(num_pp=pipe, num_dp=data)


class PipelineParallelGrid:
    """This rank's stage, data-parallel replica and model slice in `topology` (default: from the world size),
    and the groups along each axis: `dp_group` / `pp_group` / `slice_group` are rank lists, their
    `get_*_group()` the process groups."""

    def __init__(self, topology: ProcessTopology | None = None, process_group: Any = None):
        if not dist.is_initialized():
            raise CommError("PipelineParallelGrid needs torch.distributed initialized (dscomm.init_distributed())")
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._topo = topology if topology is not None else _default_topology(self.world_size)
        if not self._is_grid_valid():
            raise CommError(f"PipelineParallelGrid: the topology has {self._topo.world_size()} ranks "
                            f"({dict(zip(self._topo.get_axis_names(), self._topo.dims))}) but the world has "
                            f"{self.world_size}")
        self.data_parallel_size = max(self._topo.get_dim("data"), 1)
        self.pipe_parallel_size = max(self._topo.get_dim("pipe"), 1)
        self.model_parallel_size = max(self._topo.get_dim("model"), 1)
        self.slice_parallel_size = self.model_parallel_size
        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
        # The ranks of one data replica (every stage and slice of one model copy).
        replicas = [sorted(self._topo.get_axis_list("data", index)) for index in range(self.data_parallel_size)]
        self.ds_model_rank_list, self.ds_model_proc_group = self._member(replicas)
        self.ds_model_world_size = len(self.ds_model_rank_list)
        self.ds_model_rank = self.ds_model_rank_list.index(self.global_rank)
        self.dp_groups = self._axis_lists("data")
        self.dp_group, self.dp_proc_group = self._member(self.dp_groups)
        self.p2p_groups = self._build_p2p_groups()
        self.pipe_groups = self._axis_lists("pipe")
        self.pp_group, self.pp_proc_group = self._member(self.pipe_groups)
        self.model_groups = self._axis_lists("model")
        self.slice_group, self.slice_proc_group = self._member(self.model_groups)

    # ------------------------------------------------------------------ building
    def _axis_lists(self, axis: str) -> list[list[int]]:
        """The rank lists along `axis`; one rank each where the topology has no such axis."""
        lists = self._topo.get_axis_comm_lists(axis)
        return lists if lists else [[rank] for rank in range(self.world_size)]

    def _member(self, lists: list[list[int]]) -> tuple[list[int], Any]:
        mine, group = None, None
        for ranks in lists:  # every rank creates every group, in the same order
            created = new_group(ranks)
            if self.global_rank in ranks:
                mine, group = ranks, created
        return mine, group

    def _build_p2p_groups(self) -> list[list[int]]:
        """[rank, the rank of the next stage in its pipeline (wrapping around)] for every rank."""
        pairs = []
        for rank in range(self.world_size):
            line = next(ranks for ranks in self._axis_lists("pipe") if rank in ranks)
            pairs.append([rank, line[(line.index(rank) + 1) % len(line)]])
        return pairs

    def _is_grid_valid(self) -> bool:
        return self._topo.world_size() == dist.get_world_size()

    # ------------------------------------------------------------------ queries
    def topology(self) -> ProcessTopology:
        return self._topo

    def get_stage_id(self) -> int:
        return getattr(self._topo.get_coord(self.global_rank), "pipe", 0)

    def get_data_parallel_id(self) -> int:
        return getattr(self._topo.get_coord(self.global_rank), "data", 0)

    def stage_to_global(self, stage_id: int, **coords: int) -> int:
        """The global rank at `stage_id` (and any other coordinates given) that shares this rank's others."""
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **coords)._asdict())

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self) -> Any:
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Any:
        return self.dp_proc_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(self.dp_group)

    def get_model_parallel_rank(self) -> int:
        return self.ds_model_rank

    def get_model_parallel_world_size(self) -> int:
        return self.ds_model_world_size

    def get_model_parallel_group(self) -> Any:
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self) -> int:
        return getattr(self._topo.get_coord(self.global_rank), "model", 0)

    def get_slice_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_slice_parallel_group(self) -> Any:
        return self.slice_proc_group

    # Megatron's names for the same (what `mpu=` users call).
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_tensor_model_parallel_group = get_slice_parallel_group
