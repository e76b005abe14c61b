"""ParallelDims: the layout of a run, world = pipe x tensor x data, with expert groups inside data.

Pure arithmetic (no torch.distributed): which ranks share each group, and where the pipeline stages
and the loss live. `build()` turns it into process groups (see parallel_groups.py).

Ranks are laid out tensor fastest, then data, then pipe, as DeepSpeed's
PipeModelDataParallelTopology (axes pipe, data, model): tensor-parallel peers are neighbours, the
ranks of one pipeline stage are a contiguous block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .errors import CommError
from .topology import PipeModelDataParallelTopology, ProcessTopology

if TYPE_CHECKING:
    from .parallel_groups import ParallelGroups

# Every group a layout hands out, in the order `build()` creates them.
GROUP_NAMES = ("data", "pipe", "tensor", "expert", "expert_data", "model", "norm", "world")


class ParallelCoord(NamedTuple):
    pipe: int
    data: int
    tensor: int


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class ParallelDims:
    """world_size = pipe x tensor x data; `expert` consecutive data ranks share their experts.

    `data` defaults to world_size // (pipe * tensor). Every factor is checked at construction and a
    bad one is a CommError that prints them all.
    """

    world_size: int
    pipe: int = 1
    tensor: int = 1
    data: int | None = None  # type: ignore[assignment]  # always an int after __post_init__
    expert: int = 1

    def __post_init__(self) -> None:
        factors = {"world_size": self.world_size, "pipe": self.pipe, "tensor": self.tensor, "expert": self.expert}
        if self.data is not None:
            factors["data"] = self.data
        bad = {name: value for name, value in factors.items() if not _is_positive_int(value)}
        if bad:
            listed = ", ".join(f"{name}={value!r}" for name, value in bad.items())
            raise CommError(f"ParallelDims: every factor must be a positive integer; got {listed} "
                            f"(world {self.world_size!r}, pipe {self.pipe!r}, tensor {self.tensor!r}, "
                            f"data {self.data!r}, expert {self.expert!r})")
        model = self.pipe * self.tensor
        if self.data is None:
            if self.world_size % model:
                raise CommError(f"ParallelDims: world {self.world_size} is not a multiple of pipe {self.pipe} x "
                                f"tensor {self.tensor} = {model}; pipe x tensor must be one of: "
                                f"{_divisors(self.world_size)}")
            object.__setattr__(self, "data", self.world_size // model)
        elif model * self.data != self.world_size:
            raise CommError(f"ParallelDims: world {self.world_size} != pipe {self.pipe} x tensor {self.tensor} x "
                            f"data {self.data} = {model * self.data}")
        if self.data % self.expert:
            raise CommError(f"ParallelDims: expert {self.expert} does not divide data {self.data}; valid: "
                            f"{_divisors(self.data)}")

    @classmethod
    def from_topology(cls, topology: ProcessTopology, expert: int = 1) -> ParallelDims:
        """The layout of a DeepSpeed topology whose axes are pipe, data, model in that order (any may be absent)."""
        order = [axis for axis in ("pipe", "data", "model") if axis in topology.axes]
        if topology.axes != order:
            raise CommError(f"ParallelDims.from_topology: axes {topology.axes} are not a subsequence of "
                            f"['pipe', 'data', 'model'], so their rank layout differs from ParallelDims' "
                            f"(tensor fastest, then data, then pipe)")
        size = {axis: topology.get_dim(axis) or 1 for axis in ("pipe", "data", "model")}
        return cls(topology.world_size(), pipe=size["pipe"], tensor=size["model"], data=size["data"], expert=expert)

    # ------------------------------------------------------------------------------- coordinates
    def coords(self, rank: int) -> ParallelCoord:
        """(pipe, data, tensor) of a global rank."""
        self._check_rank(rank)
        tensor = rank % self.tensor
        data = rank // self.tensor % self.data
        return ParallelCoord(rank // (self.tensor * self.data), data, tensor)

    def rank(self, pipe: int = 0, data: int = 0, tensor: int = 0) -> int:
        """The global rank at these coordinates (each defaults to 0)."""
        for name, value, size in (("pipe", pipe, self.pipe), ("data", data, self.data), ("tensor", tensor, self.tensor)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
                raise CommError(f"ParallelDims.rank: {name}={value!r} is outside 0..{size - 1} ({self})")
        return (pipe * self.data + data) * self.tensor + tensor

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise CommError(f"ParallelDims: rank {rank!r} is outside 0..{self.world_size - 1} ({self})")

    # ------------------------------------------------------------------------------- groups
    def ranks_of(self, name: str, rank: int) -> list[int]:
        """The global ranks of `rank`'s group `name` (one of GROUP_NAMES), in increasing order."""
        pipe, data, tensor = self.coords(rank)
        if name == "data":
            return [self.rank(pipe, d, tensor) for d in range(self.data)]
        if name == "pipe":
            return [self.rank(p, data, tensor) for p in range(self.pipe)]
        if name == "tensor":
            return [self.rank(pipe, data, t) for t in range(self.tensor)]
        if name == "expert":  # `expert` consecutive data ranks hold different experts
            start = data - data % self.expert
            return [self.rank(pipe, d, tensor) for d in range(start, start + self.expert)]
        if name == "expert_data":  # the ranks at the same offset in every expert group hold the same experts
            return [self.rank(pipe, d, tensor) for d in range(data % self.expert, self.data, self.expert)]
        if name == "model":  # one replica of the model: every pipe and tensor index, same data index
            return [self.rank(p, data, t) for p in range(self.pipe) for t in range(self.tensor)]
        if name in ("norm", "world"):
            return list(range(self.world_size))
        raise CommError(f"ParallelDims: no group named {name!r}; the groups are {', '.join(GROUP_NAMES)}")

    def partition(self, name: str) -> list[list[int]]:
        """Every group `name` splits the world into, ordered by their lowest rank."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            ranks = self.ranks_of(name, rank)
            seen.setdefault(ranks[0], ranks)
        return list(seen.values())

    # ------------------------------------------------------------------------------- pipeline
    def stage_ranks(self, stage: int) -> list[int]:
        """Every rank holding pipeline stage `stage` (all data and tensor indices)."""
        return [self.rank(stage, d, t) for d in range(self.data) for t in range(self.tensor)]

    def is_first_stage(self, rank: int) -> bool:
        return self.coords(rank).pipe == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.coords(rank).pipe == self.pipe - 1

    def prev_stage_rank(self, rank: int) -> int | None:
        """The rank holding the previous stage of `rank`'s replica and tensor shard; None on the first stage."""
        pipe, data, tensor = self.coords(rank)
        return None if pipe == 0 else self.rank(pipe - 1, data, tensor)

    def next_stage_rank(self, rank: int) -> int | None:
        """The rank holding the next stage of `rank`'s replica and tensor shard; None on the last stage."""
        pipe, data, tensor = self.coords(rank)
        return None if pipe == self.pipe - 1 else self.rank(pipe + 1, data, tensor)

    def loss_rank(self, rank: int) -> int:
        """Where `rank`'s replica computes its loss: the first rank (tensor 0) of its last stage."""
        return self.rank(self.pipe - 1, self.coords(rank).data, 0)

    # ------------------------------------------------------------------------------- conversions
    def to_topology(self) -> ProcessTopology:
        """The same layout as DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model)."""
        return PipeModelDataParallelTopology(num_pp=self.pipe, num_mp=self.tensor, num_dp=self.data)  # type: ignore[arg-type]

    def build(self) -> ParallelGroups:
        """Create every group of this layout (collective: call it on every rank, in the same order)."""
        from .parallel_groups import ParallelGroups

        return ParallelGroups.create(self)

    def __str__(self) -> str:
        return (f"world {self.world_size} = pipe {self.pipe} x tensor {self.tensor} x data {self.data}, "
                f"expert {self.expert}")
