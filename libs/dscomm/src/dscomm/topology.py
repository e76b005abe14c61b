"""Process topologies: how global ranks map to coordinates on named parallel axes.

Pure Python, no torch: rank = row-major index of its coordinates, the last axis varying fastest
(so with axes pipe, data, model the tensor-parallel peers of a rank are its neighbours).
"""

from __future__ import annotations

import itertools
import math
from collections import namedtuple

from .errors import CommError
from .tags import EXPERT_GROUP_NAME_KEY, EXPERT_PARAM_GROUP_TAG, expert_group_name, is_expert_param_group

# Re-exported: the expert tags were defined here before tags.py held every parameter mark.
__all__ = ["EXPERT_GROUP_NAME_KEY", "EXPERT_PARAM_GROUP_TAG", "PipeDataParallelTopology",
           "PipeModelDataParallelTopology", "ProcessTopology", "expert_group_name", "is_expert_param_group"]


class ProcessTopology:
    """Ranks laid out on the axes `axes` with sizes `dims` (e.g. ['pipe', 'data'], [2, 4])."""

    def __init__(self, axes: list[str], dims: list[int]):
        if len(axes) != len(dims):
            raise CommError(f"ProcessTopology: {len(axes)} axes {axes} but {len(dims)} dims {dims}; give one size per axis")
        if len(set(axes)) != len(axes):
            raise CommError(f"ProcessTopology: axis names must be unique, got {axes}")
        bad = [(a, d) for a, d in zip(axes, dims) if not isinstance(d, int) or isinstance(d, bool) or d < 1]
        if bad:
            raise CommError(f"ProcessTopology: every dim must be a positive integer; got {bad}")
        self.axes = list(axes)
        self.dims = list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)  # type: ignore[misc]
        self._coord_of = [self.ProcessCoord(*c) for c in itertools.product(*(range(d) for d in dims))]
        self._rank_of = {coord: rank for rank, coord in enumerate(self._coord_of)}

    def world_size(self) -> int:
        return math.prod(self.dims)

    def get_axis_names(self) -> list[str]:
        return list(self.axes)

    def get_dim(self, axis: str) -> int:
        """Size of `axis`; 0 when the topology has no such axis (as DeepSpeed)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_rank(self, **coords: int) -> int:
        if set(coords) != set(self.axes):
            raise CommError(f"get_rank needs exactly the axes {self.axes}, got {sorted(coords)}")
        self._check_coords(coords)
        return self._rank_of[self.ProcessCoord(**coords)]

    def get_coord(self, rank: int):
        if not 0 <= rank < self.world_size():
            raise CommError(f"rank {rank} is outside this topology of {self.world_size()} ranks "
                            f"(axes {dict(zip(self.axes, self.dims))})")
        return self._coord_of[rank]

    def get_rank_repr(self, rank: int, omit_axes: tuple[str, ...] = ("data", "pipe"), inner_sep: str = "_",
                      outer_sep: str = "-") -> str:
        coord = self.get_coord(rank)
        return outer_sep.join(f"{axis}{inner_sep}{getattr(coord, axis):02d}"
                              for axis in self.axes if axis not in omit_axes)

    def filter_match(self, **coords: int) -> list[int]:
        """Ranks whose coordinates equal every given one."""
        unknown = set(coords) - set(self.axes)
        if unknown:
            raise CommError(f"filter_match: unknown axes {sorted(unknown)}; the axes are {self.axes}")
        return [rank for rank, coord in enumerate(self._coord_of)
                if all(getattr(coord, axis) == value for axis, value in coords.items())]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """Ranks whose coordinate on `axis` is `idx`."""
        return self.filter_match(**{axis: idx})

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """One list per group of ranks that differ only along `axis`: the communicators of that axis."""
        if axis not in self.axes:
            return []  # DeepSpeed returns no lists for an absent axis
        others = [a for a in self.axes if a != axis]
        lists = []
        for fixed in itertools.product(*(range(self.get_dim(a)) for a in others)):
            coords = dict(zip(others, fixed))
            lists.append([self._rank_of[self.ProcessCoord(**coords, **{axis: i})] for i in range(self.get_dim(axis))])
        return lists

    def _check_coords(self, coords: dict[str, int]) -> None:
        for axis, value in coords.items():
            dim = self.get_dim(axis)
            if not isinstance(value, int) or not 0 <= value < dim:
                raise CommError(f"coordinate {axis}={value!r} is outside 0..{dim - 1}")

    def __repr__(self) -> str:
        return f"ProcessTopology({dict(zip(self.axes, self.dims))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessTopology) and (self.axes, self.dims) == (other.axes, other.dims)

    def __hash__(self) -> int:
        return hash((tuple(self.axes), tuple(self.dims)))


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline x data parallelism; data-parallel peers are adjacent ranks."""

    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline x data x tensor (model) parallelism; tensor-parallel peers are adjacent ranks."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])
