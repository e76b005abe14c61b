"""ParallelDims: the layout of a run, world = pipe x data x sequence x tensor, with expert groups inside data.

Pure arithmetic (no torch.distributed): which ranks share each group, and where the pipeline stages
and the loss live. `build()` turns it into process groups (see parallel_groups.py).

Ranks are laid out tensor fastest, then sequence, then data, then pipe. Without sequence parallelism
that is DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model): tensor-parallel peers are
neighbours, the ranks of one pipeline stage are a contiguous block. Sequence-parallel peers (Ulysses:
each holds a slice of every sample's sequence) are neighbours after the tensor ranks, as in DeepSpeed's
sequence-parallel groups (consecutive ranks). ZeRO partitions and reduces over `sequence_data`: the
ranks of every data and sequence index that hold the same model shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .errors import CommError
from .topology import PipeModelDataParallelTopology, ProcessTopology

if TYPE_CHECKING:
    from .parallel_groups import ParallelGroups

# Every group a layout hands out, in the order `build()` creates them (new names go last: every rank
# creates the groups in this order, and a layout without sequence parallelism creates no new ones).
GROUP_NAMES = ("data", "pipe", "tensor", "expert", "expert_data", "model", "norm", "world", "sequence",
               "sequence_data")


class ParallelCoord(NamedTuple):
    pipe: int
    data: int
    tensor: int
    sequence: int = 0


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class ParallelDims:
    """world_size = pipe x tensor x sequence x data; `expert` consecutive data ranks share their experts.

    `data` defaults to world_size // (pipe * tensor * sequence). Every factor is checked at
    construction and a bad one is a CommError that prints them all. `sequence` ranks split each
    sample's sequence (Ulysses); they count as one data-parallel replica for the batch size.
    """

    world_size: int
    pipe: int = 1
    tensor: int = 1
    data: int | None = None  # type: ignore[assignment]  # always an int after __post_init__
    expert: int = 1
    sequence: int = 1

    def __post_init__(self) -> None:
        factors = {"world_size": self.world_size, "pipe": self.pipe, "tensor": self.tensor, "expert": self.expert,
                   "sequence": self.sequence}
        if self.data is not None:
            factors["data"] = self.data
        bad = {name: value for name, value in factors.items() if not _is_positive_int(value)}
        if bad:
            listed = ", ".join(f"{name}={value!r}" for name, value in bad.items())
            raise CommError(f"ParallelDims: every factor must be a positive integer; got {listed} "
                            f"(world {self.world_size!r}, pipe {self.pipe!r}, tensor {self.tensor!r}, "
                            f"data {self.data!r}, expert {self.expert!r}, sequence {self.sequence!r})")
        model = self.pipe * self.tensor * self.sequence
        names = "pipe x tensor" + (" x sequence" if self.sequence > 1 else "")
        product = f"pipe {self.pipe} x tensor {self.tensor}" + (f" x sequence {self.sequence}"
                                                                if self.sequence > 1 else "")
        if self.data is None:
            if self.world_size % model:
                raise CommError(f"ParallelDims: world {self.world_size} is not a multiple of {product} = {model}; "
                                f"{names} must be one of: {_divisors(self.world_size)}")
            object.__setattr__(self, "data", self.world_size // model)
        elif model * self.data != self.world_size:
            raise CommError(f"ParallelDims: world {self.world_size} != {product} x data {self.data} = "
                            f"{model * self.data}")
        if self.data % self.expert:
            raise CommError(f"ParallelDims: expert {self.expert} does not divide data {self.data}; valid: "
                            f"{_divisors(self.data)}")

    @classmethod
    def from_topology(cls, topology: ProcessTopology, expert: int = 1) -> ParallelDims:
        """The layout of a DeepSpeed topology whose axes are pipe, data, (sequence,) model in that order (any
        may be absent)."""
        axes = ("pipe", "data", "sequence", "model")
        order = [axis for axis in axes if axis in topology.axes]
        if topology.axes != order:
            raise CommError(f"ParallelDims.from_topology: axes {topology.axes} are not a subsequence of "
                            f"{list(axes)}, so their rank layout differs from ParallelDims' "
                            f"(tensor fastest, then sequence, then data, then pipe)")
        size = {axis: topology.get_dim(axis) or 1 for axis in axes}
        return cls(topology.world_size(), pipe=size["pipe"], tensor=size["model"], data=size["data"], expert=expert,
                   sequence=size["sequence"])

    # ------------------------------------------------------------------------------- coordinates
    def coords(self, rank: int) -> ParallelCoord:
        """(pipe, data, tensor, sequence) of a global rank."""
        self._check_rank(rank)
        tensor = rank % self.tensor
        sequence = rank // self.tensor % self.sequence
        data = rank // (self.tensor * self.sequence) % self.data
        return ParallelCoord(rank // (self.tensor * self.sequence * self.data), data, tensor, sequence)

    def rank(self, pipe: int = 0, data: int = 0, tensor: int = 0, sequence: int = 0) -> int:
        """The global rank at these coordinates (each defaults to 0)."""
        for name, value, size in (("pipe", pipe, self.pipe), ("data", data, self.data), ("tensor", tensor, self.tensor),
                                  ("sequence", sequence, self.sequence)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
                raise CommError(f"ParallelDims.rank: {name}={value!r} is outside 0..{size - 1} ({self})")
        return ((pipe * self.data + data) * self.sequence + sequence) * self.tensor + tensor

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise CommError(f"ParallelDims: rank {rank!r} is outside 0..{self.world_size - 1} ({self})")

    # ------------------------------------------------------------------------------- groups
    def ranks_of(self, name: str, rank: int) -> list[int]:
        """The global ranks of `rank`'s group `name` (one of GROUP_NAMES), in increasing order."""
        pipe, data, tensor, seq = self.coords(rank)
        if name == "data":
            return [self.rank(pipe, d, tensor, seq) for d in range(self.data)]
        if name == "pipe":
            return [self.rank(p, data, tensor, seq) for p in range(self.pipe)]
        if name == "tensor":
            return [self.rank(pipe, data, t, seq) for t in range(self.tensor)]
        if name == "sequence":  # the ranks that split one sample's sequence
            return [self.rank(pipe, data, tensor, s) for s in range(self.sequence)]
        if name == "sequence_data":  # the ranks holding the same model shard: ZeRO's group
            return [self.rank(pipe, d, tensor, s) for d in range(self.data) for s in range(self.sequence)]
        if name == "expert":  # `expert` consecutive data ranks hold different experts
            start = data - data % self.expert
            return [self.rank(pipe, d, tensor, seq) for d in range(start, start + self.expert)]
        if name == "expert_data":  # the ranks at the same offset in every expert group hold the same experts
            return [self.rank(pipe, d, tensor, seq) for d in range(data % self.expert, self.data, self.expert)]
        if name == "model":  # one copy of the weights: every pipe and tensor index, same data and sequence index
            return [self.rank(p, data, t, seq) for p in range(self.pipe) for t in range(self.tensor)]
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
        """Every rank holding pipeline stage `stage` (all data, sequence and tensor indices)."""
        return [self.rank(stage, d, t, s) for d in range(self.data) for s in range(self.sequence)
                for t in range(self.tensor)]

    def is_first_stage(self, rank: int) -> bool:
        return self.coords(rank).pipe == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.coords(rank).pipe == self.pipe - 1

    def prev_stage_rank(self, rank: int) -> int | None:
        """The rank holding the previous stage of `rank`'s replica and tensor shard; None on the first stage."""
        pipe, data, tensor, seq = self.coords(rank)
        return None if pipe == 0 else self.rank(pipe - 1, data, tensor, seq)

    def next_stage_rank(self, rank: int) -> int | None:
        """The rank holding the next stage of `rank`'s replica and tensor shard; None on the last stage."""
        pipe, data, tensor, seq = self.coords(rank)
        return None if pipe == self.pipe - 1 else self.rank(pipe + 1, data, tensor, seq)

    def loss_rank(self, rank: int) -> int:
        """Where `rank`'s replica computes its loss: the first rank (tensor 0) of its last stage."""
        coord = self.coords(rank)
        return self.rank(self.pipe - 1, coord.data, 0, coord.sequence)

    # ------------------------------------------------------------------------------- conversions
    def to_topology(self) -> ProcessTopology:
        """The same layout as DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model); with sequence
        parallelism a "sequence" axis sits between data and model."""
        if self.sequence > 1:
            return ProcessTopology(axes=["pipe", "data", "sequence", "model"],
                                   dims=[self.pipe, self.data, self.sequence, self.tensor])  # type: ignore[list-item]
        return PipeModelDataParallelTopology(num_pp=self.pipe, num_mp=self.tensor, num_dp=self.data)  # type: ignore[arg-type]

    def build(self) -> ParallelGroups:
        """Create every group of this layout (collective: call it on every rank, in the same order)."""
        from .parallel_groups import ParallelGroups

        return ParallelGroups.create(self)

    def __str__(self) -> str:
        sequence = f" x sequence {self.sequence}" if self.sequence > 1 else ""
        return (f"world {self.world_size} = pipe {self.pipe} x tensor {self.tensor}{sequence} x data {self.data}, "
                f"expert {self.expert}")
