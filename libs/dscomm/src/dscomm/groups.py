"""DeepSpeed's group getters, answered from the ParallelGroups the facade registered with `use()`.

Libraries take their groups as arguments; these getters exist for code written against
`deepspeed.utils.groups`. With no layout registered they answer for a world that is all data
parallel, and they register nothing: a later `use()` of any layout takes effect.

    groups = dscomm.ParallelDims(world, pipe=2).build()   # collective
    dscomm.groups.use(groups)
    dscomm.groups.get_data_parallel_group()               # groups.data

Expert groups of an `ep_size` other than the registered layout's are created collectively on their
first getter call, over the current data groups, and forgotten when another layout is registered.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .backend import is_initialized
from .dims import ParallelDims
from .errors import CommError
from .parallel_groups import ParallelGroups, forget_self_group, new_group, self_group
from .tags import expert_group_name
from .topology import ProcessTopology

DATA, PIPE, MODEL = "data", "pipe", "model"


class _Registry:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.groups: ParallelGroups | None = None
        # ep_size -> (expert group, its ranks, expert-data group, its ranks), for the current layout
        self.expert_groups: dict[int, tuple[Any, list[int], Any, list[int]]] = {}


_REGISTRY = _Registry()


def use(groups: ParallelGroups) -> None:
    """Make `groups` the layout the getters answer for (replacing any registered before)."""
    if not isinstance(groups, ParallelGroups):
        raise CommError(f"dscomm.groups.use takes the ParallelGroups of ParallelDims(...).build(), got "
                        f"{type(groups).__name__}")
    _require_world()
    if groups.dims.world_size != dist.get_world_size() or groups.global_rank != dist.get_rank():
        raise CommError(f"dscomm.groups.use: {groups!r} was built for another world (this is rank "
                        f"{dist.get_rank()} of {dist.get_world_size()})")
    _REGISTRY.reset()
    _REGISTRY.groups = groups


def current() -> ParallelGroups | None:
    """The registered layout's groups, or None when none is registered."""
    return _REGISTRY.groups


def reset() -> None:
    """Forget the registered layout and cached groups (the process groups go with destroy_process_group)."""
    _REGISTRY.reset()
    forget_self_group()


def initialize(topology: ProcessTopology | None = None) -> ProcessTopology:
    """Build the groups of a DeepSpeed `topology` (default: data parallel over the world) and `use()` them.

    Collective. Calling it again with the same topology is harmless; with another one it is an error
    (a second, different layout is registered with `use()`).
    """
    _require_world()
    world = dist.get_world_size()
    topology = topology or ProcessTopology(axes=[DATA], dims=[world])
    registered = _REGISTRY.groups
    if registered is not None:
        if registered.dims == ParallelDims.from_topology(topology, expert=registered.dims.expert):
            return registered.topology
        raise CommError(f"groups already initialised for {registered.topology}; register another layout with "
                        f"dscomm.groups.use(ParallelDims(...).build()) instead of switching to {topology}")
    if topology.world_size() != world:
        factors = " x ".join(f"{axis} {dim}" for axis, dim in zip(topology.axes, topology.dims))
        raise CommError(f"topology {factors} = {topology.world_size()} ranks, but the world has {world}")
    groups = ParallelDims.from_topology(topology).build()
    use(groups)
    groups._topology = topology  # initialize() hands back the caller's own topology
    return topology


def get_topology() -> ProcessTopology:
    if _REGISTRY.groups is not None:
        return _REGISTRY.groups.topology
    _require_world()
    return ProcessTopology(axes=[DATA], dims=[dist.get_world_size()])


def _require_world() -> None:
    if not is_initialized():
        raise CommError("dscomm.groups: torch.distributed is not initialised; call dscomm.init_distributed() "
                        "first")


def _axis(name: str) -> tuple[Any, int, int]:
    """(this rank's group `name`, its size, this rank's index in it)."""
    groups = _REGISTRY.groups
    if groups is not None:
        return groups.group(name), groups.size(name), groups.rank_in(name)
    _require_world()
    if name in ("data", "sequence_data"):  # all data parallel: the whole world
        return dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    return self_group(), 1, 0


def get_data_parallel_group() -> Any:
    return _axis("data")[0]


_get_data_parallel_group = get_data_parallel_group  # DeepSpeed's name


def get_pipeline_parallel_group() -> Any:
    return _axis("pipe")[0]


def get_tensor_parallel_group() -> Any:
    return _axis("tensor")[0]


get_model_parallel_group = get_tensor_parallel_group  # DeepSpeed's "model parallel" is tensor parallel


def get_data_parallel_world_size() -> int:
    return _axis("data")[1]


def get_pipeline_parallel_world_size() -> int:
    return _axis("pipe")[1]


def get_tensor_parallel_world_size() -> int:
    return _axis("tensor")[1]


get_model_parallel_world_size = get_tensor_parallel_world_size


def get_data_parallel_rank() -> int:
    return _axis("data")[2]


def get_pipeline_parallel_rank() -> int:
    return _axis("pipe")[2]


def get_tensor_parallel_rank() -> int:
    return _axis("tensor")[2]


get_model_parallel_rank = get_tensor_parallel_rank

# DeepSpeed's AutoTP spelling of the same three, and the source rank a tensor group broadcasts from.
get_tensor_model_parallel_group = get_tensor_parallel_group
get_tensor_model_parallel_world_size = get_tensor_parallel_world_size
get_tensor_model_parallel_rank = get_tensor_parallel_rank


def get_tensor_model_parallel_src_rank() -> int:
    """The global rank of the first rank of this rank's tensor group (what it broadcasts replicated inputs
    from): this rank itself without tensor parallelism."""
    group, size, _ = _axis("tensor")
    return get_group_ranks(group)[0] if size > 1 else dist.get_rank()


# ------------------------------------------------------------------ sequence parallelism (Ulysses)
# DeepSpeed's scripts call the underscored names (`groups._get_sequence_parallel_group()`); both spellings
# answer. Without sequence parallelism the sequence group is this rank alone and sequence_data is data.
def get_sequence_parallel_group() -> Any:
    return _axis("sequence")[0]


def get_sequence_parallel_world_size() -> int:
    return _axis("sequence")[1]


def get_sequence_parallel_rank() -> int:
    return _axis("sequence")[2]


def get_sequence_data_parallel_group() -> Any:
    return _axis("sequence_data")[0]


def get_sequence_data_parallel_world_size() -> int:
    return _axis("sequence_data")[1]


def get_sequence_data_parallel_rank() -> int:
    return _axis("sequence_data")[2]


_get_sequence_parallel_group = get_sequence_parallel_group
_get_sequence_parallel_world_size = get_sequence_parallel_world_size
_get_sequence_parallel_rank = get_sequence_parallel_rank
_get_sequence_data_parallel_group = get_sequence_data_parallel_group
_get_sequence_data_parallel_world_size = get_sequence_data_parallel_world_size
_get_sequence_data_parallel_rank = get_sequence_data_parallel_rank


def get_group_ranks(group: Any) -> list[int]:
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


# ------------------------------------------------------------------ experts
def create_expert_groups(ep_size: int) -> None:
    """Expert-parallel groups (ep_size consecutive data-parallel ranks) and expert-data-parallel groups
    (the ranks holding the same experts: every ep_size-th data-parallel rank) of the current layout.
    Collective; the registered layout's own expert size needs no call."""
    registered = _REGISTRY.groups
    if registered is not None and ep_size == registered.dims.expert:
        return
    if ep_size in _REGISTRY.expert_groups:
        return
    _require_world()
    base = registered.dims if registered is not None else ParallelDims(dist.get_world_size())
    if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1 or base.data % ep_size:  # type: ignore[operator]
        divisors = [d for d in range(1, base.data + 1) if base.data % d == 0]  # type: ignore[operator]
        raise CommError(f"expert-parallel size {ep_size} must divide the data-parallel size {base.data}; "
                        f"valid: {divisors}")
    dims = ParallelDims(base.world_size, pipe=base.pipe, tensor=base.tensor, data=base.data, expert=ep_size,
                        sequence=base.sequence)
    me = dist.get_rank()
    mine: dict[str, tuple[Any, list[int]]] = {}
    for name in ("expert", "expert_data"):
        for ranks in dims.partition(name):
            group = new_group(ranks)
            if me in ranks:
                mine[name] = (group, ranks)
    _REGISTRY.expert_groups[ep_size] = (*mine["expert"], *mine["expert_data"])


def _create_expert_and_data_parallel(expert_parallel_size_: int, use_data_before_expert_parallel_: bool = False) -> None:
    """DeepSpeed's name for create_expert_groups (collective). Only DeepSpeed's default rank order is built:
    expert groups of consecutive data-parallel ranks."""
    if use_data_before_expert_parallel_:
        raise CommError("_create_expert_and_data_parallel: use_data_before_expert_parallel_=True (expert groups of "
                        "strided ranks) is not provided; dscomm's expert groups are consecutive data-parallel ranks "
                        "(leave it False)")
    create_expert_groups(expert_parallel_size_)


def _get_expert_parallel_ranks(world_size: int, tensor_parallel_size_: int, expert_parallel_size_: int,
                               pipeline_parallel_size_: int = 1,
                               use_data_before_expert_parallel_: bool = False) -> tuple[list[list[int]], list[list[int]]]:
    """DeepSpeed's arithmetic of the expert groups (pure: no process group): (expert-parallel groups, expert-data-
    parallel groups) of a world of `world_size` ranks, as create_expert_groups builds them. DeepSpeed's order: for
    each data-parallel group (by lowest rank), its expert groups (consecutive chunks of expert_parallel_size_), and
    its expert-data groups (every expert_parallel_size_-th rank of it, from each offset)."""
    if use_data_before_expert_parallel_:
        raise CommError("_get_expert_parallel_ranks: use_data_before_expert_parallel_=True (expert groups of strided "
                        "ranks) is not provided; dscomm's expert groups are consecutive data-parallel ranks (leave it "
                        "False)")
    dims = ParallelDims(world_size, pipe=pipeline_parallel_size_, tensor=tensor_parallel_size_,
                        expert=expert_parallel_size_)
    expert, expert_data = [], []
    for ranks in dims.partition("data"):
        expert += [ranks[i:i + expert_parallel_size_] for i in range(0, len(ranks), expert_parallel_size_)]
        expert_data += [ranks[i::expert_parallel_size_] for i in range(expert_parallel_size_)]
    return expert, expert_data


def _get_expert_model_parallel_world_size() -> int:
    """How many tensor-parallel ranks share one expert: always 1, experts are never tensor-parallel here
    (dsmoe refuses enable_expert_tensor_parallelism=True), whatever the non-expert layers' tensor parallelism."""
    return 1


def _experts(ep_size: int) -> tuple[Any, list[int], Any, list[int]]:
    registered = _REGISTRY.groups
    if registered is not None and ep_size == registered.dims.expert:
        return (registered.expert, registered.ranks("expert"), registered.expert_data, registered.ranks("expert_data"))
    create_expert_groups(ep_size)
    return _REGISTRY.expert_groups[ep_size]


def _get_max_expert_parallel_group() -> Any:
    """DeepSpeed's name: the expert-parallel group of the largest expert size built so far (the registered
    layout's or create_expert_groups'), where an overflow in any expert must be seen by all; None when no expert
    groups exist."""
    registered = _REGISTRY.groups
    sizes = set(_REGISTRY.expert_groups)
    if registered is not None and registered.dims.expert > 1:
        sizes.add(registered.dims.expert)
    return get_expert_parallel_group(max(sizes)) if sizes else None


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
