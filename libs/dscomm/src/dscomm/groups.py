"""The process groups of a parallel topology, created once and cached.

Creating a group is collective: every rank calls `torch.distributed.new_group` for every group, in
the same order, including the groups it is not part of. So `initialize()` and the first call of an
expert getter for a given ep_size must be made on every rank, in the same order.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .backend import get_world_size, is_initialized
from .errors import CommError
from .topology import ProcessTopology, expert_group_name

DATA, PIPE, MODEL = "data", "pipe", "model"


class _Registry:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.topology: ProcessTopology | None = None
        self.axis_groups: dict[str, tuple[Any, list[int]]] = {}       # axis -> (this rank's group, its ranks)
        self.expert_groups: dict[int, tuple[Any, list[int], Any, list[int]]] = {}  # ep_size -> EP, EDP


_REGISTRY = _Registry()


def _new_group(ranks: list[int]) -> Any:
    if len(ranks) == dist.get_world_size():
        return dist.group.WORLD
    return dist.new_group(ranks)


def initialize(topology: ProcessTopology | None = None) -> ProcessTopology:
    """Create the data / pipeline / tensor groups of `topology` (default: data parallel over the world).

    Collective. Calling it again with the same topology is harmless; with another one, it is an
    error (call `reset()` first).
    """
    if not is_initialized():
        raise CommError("dscomm.groups.initialize: torch.distributed is not initialised; call "
                        "dscomm.init_distributed() first")
    world = dist.get_world_size()
    topology = topology or ProcessTopology(axes=[DATA], dims=[world])
    if _REGISTRY.topology is not None:
        if _REGISTRY.topology == topology:
            return _REGISTRY.topology
        raise CommError(f"groups already initialised for {_REGISTRY.topology}; call dscomm.groups.reset() before "
                        f"switching to {topology}")
    if topology.world_size() != world:
        factors = " x ".join(f"{axis} {dim}" for axis, dim in zip(topology.axes, topology.dims))
        raise CommError(f"topology {factors} = {topology.world_size()} ranks, but the world has {world}")
    me = dist.get_rank()
    for axis in (PIPE, DATA, MODEL, *[a for a in topology.axes if a not in (PIPE, DATA, MODEL)]):
        # An axis the topology lacks has size 1: every rank is its own group.
        lists = topology.get_axis_comm_lists(axis) or [[r] for r in range(world)]
        for ranks in lists:
            group = _new_group(ranks)
            if me in ranks:
                _REGISTRY.axis_groups[axis] = (group, ranks)
    _REGISTRY.topology = topology
    return topology


def reset() -> None:
    """Forget the cached groups (the process groups themselves go with destroy_process_group)."""
    _REGISTRY.reset()


def _ensure() -> None:
    if _REGISTRY.topology is None:
        initialize()


def get_topology() -> ProcessTopology:
    _ensure()
    return _REGISTRY.topology  # type: ignore[return-value]


def _axis(axis: str) -> tuple[Any, list[int]]:
    _ensure()
    return _REGISTRY.axis_groups[axis]


def get_data_parallel_group() -> Any:
    return _axis(DATA)[0]


def get_pipeline_parallel_group() -> Any:
    return _axis(PIPE)[0]


def get_tensor_parallel_group() -> Any:
    return _axis(MODEL)[0]


get_model_parallel_group = get_tensor_parallel_group


def get_data_parallel_world_size() -> int:
    return len(_axis(DATA)[1])


def get_pipeline_parallel_world_size() -> int:
    return len(_axis(PIPE)[1])


def get_tensor_parallel_world_size() -> int:
    return len(_axis(MODEL)[1])


get_model_parallel_world_size = get_tensor_parallel_world_size


def get_data_parallel_rank() -> int:
    return _axis(DATA)[1].index(dist.get_rank())


def get_pipeline_parallel_rank() -> int:
    return _axis(PIPE)[1].index(dist.get_rank())


def get_tensor_parallel_rank() -> int:
    return _axis(MODEL)[1].index(dist.get_rank())


get_model_parallel_rank = get_tensor_parallel_rank


def get_group_ranks(group: Any) -> list[int]:
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


# ------------------------------------------------------------------ experts
def create_expert_groups(ep_size: int) -> None:
    """Expert-parallel groups (ep_size consecutive data-parallel ranks) and expert-data-parallel groups
    (the ranks holding the same experts: every ep_size-th data-parallel rank). Collective."""
    _ensure()
    if ep_size in _REGISTRY.expert_groups:
        return
    data_lists = _REGISTRY.topology.get_axis_comm_lists(DATA) or [list(range(get_world_size()))]  # type: ignore[union-attr]
    dp = len(data_lists[0])
    if not isinstance(ep_size, int) or ep_size < 1 or dp % ep_size:
        divisors = [d for d in range(1, dp + 1) if dp % d == 0]
        raise CommError(f"expert-parallel size {ep_size} must divide the data-parallel size {dp}; valid: {divisors}")
    me = dist.get_rank()
    mine: list[Any] = [None, None, None, None]
    for ranks in data_lists:
        for start in range(0, dp, ep_size):
            ep_ranks = ranks[start:start + ep_size]
            group = _new_group(ep_ranks)
            if me in ep_ranks:
                mine[0:2] = [group, ep_ranks]
    for ranks in data_lists:
        for offset in range(ep_size):
            edp_ranks = ranks[offset::ep_size]
            group = _new_group(edp_ranks)
            if me in edp_ranks:
                mine[2:4] = [group, edp_ranks]
    _REGISTRY.expert_groups[ep_size] = tuple(mine)  # type: ignore[assignment]


def _experts(ep_size: int) -> tuple[Any, list[int], Any, list[int]]:
    create_expert_groups(ep_size)
    return _REGISTRY.expert_groups[ep_size]


def get_expert_parallel_group(ep_size: int) -> Any:
    return _experts(ep_size)[0]


def get_expert_data_parallel_group(ep_size: int) -> Any:
    return _experts(ep_size)[2]


def get_expert_parallel_world_size(ep_size: int) -> int:
    return len(_experts(ep_size)[1])


def get_expert_data_parallel_world_size(ep_size: int) -> int:
    return len(_experts(ep_size)[3])


def get_expert_parallel_rank(ep_size: int) -> int:
    return _experts(ep_size)[1].index(dist.get_rank())


def get_expert_data_parallel_rank(ep_size: int) -> int:
    return _experts(ep_size)[3].index(dist.get_rank())


def get_expert_parallel_group_name(ep_size: int) -> str:
    return expert_group_name(ep_size)
