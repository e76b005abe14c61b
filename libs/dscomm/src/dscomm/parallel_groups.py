"""ParallelGroups: the process groups of one ParallelDims, created together on every rank.

Creating a group is collective, so `ParallelDims.build()` makes every rank create every group of
the layout in the same order, including the ones it is not in. Groups with the same ranks are one
process group (with pipe 1 the tensor and model groups are the same ranks; expert groups often
equal data groups), the whole world is torch's default group, and a rank alone in a group gets a
one-rank group that only it creates.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .dims import GROUP_NAMES, ParallelDims
from .errors import CommError

_SELF_GROUP: dict[str, Any] = {}  # {"world": default group, "group": this rank alone}


def self_group() -> Any:
    """A process group holding only this rank, created once per world and only by this rank."""
    world = dist.group.WORLD
    if dist.get_world_size() == 1:
        return world
    if _SELF_GROUP.get("world") is not world:
        # Local synchronisation: the other ranks need not call it, and the group names they give
        # to their collectively created groups stay in step.
        group = dist.new_group([dist.get_rank()], use_local_synchronization=True)
        _SELF_GROUP.update(world=world, group=group)
    return _SELF_GROUP["group"]


def forget_self_group() -> None:
    _SELF_GROUP.clear()


class ParallelGroups:
    """This rank's process group for each group of `dims`: `.data`, `.pipe`, `.tensor`, `.expert`,
    `.expert_data`, `.model` (pipe x tensor: one copy of the weights), `.norm` (where gradient norms and
    the fp16 overflow are decided: the whole layout), `.world`, `.sequence` (the ranks splitting one
    sample's sequence) and `.sequence_data` (sequence x data: where ZeRO partitions and reduces)."""

    def __init__(self, dims: ParallelDims, rank: int, members: dict[str, tuple[Any, list[int]]]) -> None:
        self.dims = dims
        self.global_rank = rank
        self._members = members
        self._topology: Any = None

    @classmethod
    def create(cls, dims: ParallelDims) -> ParallelGroups:
        if not (dist.is_available() and dist.is_initialized()):
            raise CommError(f"ParallelDims.build ({dims}): torch.distributed is not initialised; call "
                            f"dscomm.init_distributed() first")
        world = dist.get_world_size()
        if world != dims.world_size:
            raise CommError(f"ParallelDims.build: the layout is for {dims.world_size} ranks ({dims}) but the "
                            f"world has {world}")
        me = dist.get_rank()
        created: dict[tuple[int, ...], Any] = {}
        members: dict[str, tuple[Any, list[int]]] = {}
        for name in GROUP_NAMES:
            for ranks in dims.partition(name):
                key = tuple(ranks)
                if key not in created:
                    created[key] = new_group(ranks)
                if me in ranks:
                    members[name] = (created[key], ranks)
        return cls(dims, me, members)

    # ---------------------------------------------------------------------------------- by name
    def group(self, name: str) -> Any:
        """This rank's process group `name` (one of dscomm.dims.GROUP_NAMES)."""
        return self._member(name)[0]

    def ranks(self, name: str) -> list[int]:
        """The global ranks of this rank's group `name`."""
        return list(self._member(name)[1])

    def size(self, name: str) -> int:
        return len(self._member(name)[1])

    def rank_in(self, name: str) -> int:
        """This rank's index within its group `name`."""
        return self._member(name)[1].index(self.global_rank)

    def _member(self, name: str) -> tuple[Any, list[int]]:
        if name not in self._members:
            raise CommError(f"ParallelGroups: no group named {name!r}; the groups are {', '.join(GROUP_NAMES)}")
        return self._members[name]

    data = property(lambda self: self.group("data"), doc="This rank's data-parallel group.")
    pipe = property(lambda self: self.group("pipe"), doc="This rank's pipeline group (one rank per stage).")
    tensor = property(lambda self: self.group("tensor"), doc="This rank's tensor-parallel group.")
    expert = property(lambda self: self.group("expert"), doc="The data ranks holding different experts.")
    expert_data = property(lambda self: self.group("expert_data"), doc="The data ranks holding the same experts.")
    model = property(lambda self: self.group("model"), doc="One copy of the weights: pipe x tensor.")
    sequence = property(lambda self: self.group("sequence"), doc="The ranks splitting one sample's sequence.")
    sequence_data = property(lambda self: self.group("sequence_data"),
                             doc="Sequence x data ranks holding the same model shard: ZeRO's group.")
    norm = property(lambda self: self.group("norm"), doc="Where gradient norms and fp16 overflow are decided.")
    world = property(lambda self: self.group("world"), doc="Every rank of the layout.")

    # ---------------------------------------------------------------------------------- pipeline
    @property
    def stage(self) -> int:
        """This rank's pipeline stage."""
        return self.dims.coords(self.global_rank).pipe

    @property
    def loss_rank(self) -> int:
        """The rank that computes this replica's loss: the first rank of its last stage."""
        return self.dims.loss_rank(self.global_rank)

    @property
    def is_first_stage(self) -> bool:
        return self.dims.is_first_stage(self.global_rank)

    @property
    def is_last_stage(self) -> bool:
        return self.dims.is_last_stage(self.global_rank)

    @property
    def prev_stage_rank(self) -> int | None:
        return self.dims.prev_stage_rank(self.global_rank)

    @property
    def next_stage_rank(self) -> int | None:
        return self.dims.next_stage_rank(self.global_rank)

    @property
    def topology(self) -> Any:
        """The layout as a DeepSpeed ProcessTopology (made once, so callers can compare it by identity)."""
        if self._topology is None:
            self._topology = self.dims.to_topology()
        return self._topology

    # ----------------------------------------------- the `mpu` interface activation checkpointing reads
    def get_tensor_model_parallel_rank(self) -> int:
        return self.rank_in("tensor")

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.size("tensor")

    def get_tensor_model_parallel_group(self) -> Any:
        return self.tensor

    # ----------------------------------------------- the sequence-parallel `mpu` interface (DeepSpeed's names)
    def get_sequence_parallel_group(self) -> Any:
        return self.sequence

    def get_sequence_parallel_world_size(self) -> int:
        return self.size("sequence")

    def get_sequence_parallel_rank(self) -> int:
        return self.rank_in("sequence")

    def get_sequence_data_parallel_group(self) -> Any:
        return self.sequence_data

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.size("sequence_data")

    def get_sequence_data_parallel_rank(self) -> int:
        return self.rank_in("sequence_data")

    def __repr__(self) -> str:
        return f"ParallelGroups(rank {self.global_rank} of {self.dims})"


def new_group(ranks: list[int]) -> Any:
    """A process group of `ranks` (collective for every rank, except a one-rank group: only its member
    creates it, the others get None); the whole world is torch's default group."""
    me = dist.get_rank()
    if len(ranks) == dist.get_world_size():
        return dist.group.WORLD
    if len(ranks) == 1:
        return self_group() if ranks == [me] else None
    return dist.new_group(ranks)
