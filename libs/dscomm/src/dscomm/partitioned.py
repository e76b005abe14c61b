"""PartitionedTensor: a tensor split over a group's ranks, each keeping one contiguous piece of its flattened
elements (pipeline activations sent in pieces, DeepSpeed's `runtime.utils.PartitionedTensor`). `to_meta()` is an
int64 tensor that describes the split (shape, pieces), so a receiver can rebuild the object with `from_meta`
from the meta and its own piece; `full()` gathers the pieces back into the whole tensor on every rank."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

from .collectives import all_gather
from .errors import CommError


def piece_bounds(numel: int, parts: int) -> list[int]:
    """Where each rank's piece starts, and the end: as even as whole elements allow (the first pieces take
    the remainder, one element each)."""
    if parts < 1 or numel < 0:
        raise CommError(f"PartitionedTensor: cannot split {numel} elements into {parts} pieces")
    base, extra = divmod(numel, parts)
    bounds = [0]
    for rank in range(parts):
        bounds.append(bounds[-1] + base + (1 if rank < extra else 0))
    return bounds


class PartitionedTensor:
    """`tensor` split over `group`'s ranks; this rank keeps `local_data`, its piece of the flattened tensor."""

    def __init__(self, tensor: torch.Tensor, group: Any = None, partition_meta: torch.Tensor | None = None):
        self.group = group
        self.num_parts = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if partition_meta is not None:  # from_meta: `tensor` is this rank's piece already
            self.orig_size, self.partition = _read_meta(partition_meta, self.num_parts)
            self.local_data = tensor
        else:
            self.orig_size = list(tensor.shape)
            self.partition = piece_bounds(tensor.numel(), self.num_parts)
            flat = tensor.detach().reshape(-1)
            self.local_data = flat[self.partition[self.rank]:self.partition[self.rank + 1]].clone()
        self.orig_device = self.local_data.device
        expected = self.partition[self.rank + 1] - self.partition[self.rank]
        if self.local_data.numel() != expected:
            raise CommError(f"PartitionedTensor: rank {self.rank}'s piece has {self.local_data.numel()} elements; "
                            f"the meta says {expected}")

    @classmethod
    def from_meta(cls, meta: torch.Tensor, local_part: torch.Tensor, group: Any = None,
                  device: Any = None) -> PartitionedTensor:
        return cls(local_part if device is None else local_part.to(device), group=group, partition_meta=meta)

    def to_meta(self) -> torch.Tensor:
        """[ndim, *shape, parts, *bounds] as int64 on the piece's device."""
        values = [len(self.orig_size), *self.orig_size, self.num_parts, *self.partition]
        return torch.tensor(values, dtype=torch.long, device=self.orig_device)

    def data(self) -> torch.Tensor:
        return self.local_data

    def local_size(self) -> torch.Size:
        return self.local_data.size()

    def full(self, device: Any = None) -> torch.Tensor:
        """The whole tensor, gathered from every rank's piece (pieces padded to the largest for the collective)."""
        longest = max(b - a for a, b in itertools.pairwise(self.partition))
        padded = torch.zeros(longest, dtype=self.local_data.dtype, device=self.local_data.device)
        padded[:self.local_data.numel()] = self.local_data.reshape(-1)
        pieces = [torch.empty_like(padded) for _ in range(self.num_parts)]
        all_gather(pieces, padded, group=self.group)
        whole = torch.cat([piece[:b - a] for piece, a, b in zip(pieces, self.partition, self.partition[1:])])
        whole = whole.view(self.orig_size)
        return whole if device is None else whole.to(device)


def _read_meta(meta: torch.Tensor, parts: int) -> tuple[list[int], list[int]]:
    values = [int(v) for v in meta.reshape(-1).tolist()]
    if not values or values[0] < 0 or len(values) < 1 + values[0] + 1:
        raise CommError(f"PartitionedTensor.from_meta: not a meta tensor: {values[:8]}")
    ndim = values[0]
    shape, rest = values[1:1 + ndim], values[1 + ndim:]
    if rest[0] != parts or len(rest) != parts + 2:
        raise CommError(f"PartitionedTensor.from_meta: the meta describes {rest[0]} pieces; this group has {parts}")
    bounds = rest[1:]
    numel = 1
    for size in shape:
        numel *= size
    if bounds[0] != 0 or bounds[-1] != numel or any(b < a for a, b in itertools.pairwise(bounds)):
        raise CommError(f"PartitionedTensor.from_meta: pieces {bounds} do not cover a tensor of shape {shape}")
    return shape, bounds
