"""Which rank computes each whole tensor, and which pieces travel where (pure Python, no torch).

A whole-tensor step (see whole_tensors.py) gives every tensor that needs whole-tensor work to one
owner rank of its process group. Owners are chosen largest tensor first, each onto the rank with
the least work so far (ties: the rank that already holds most of the tensor, so less of it moves,
then the lowest rank), which keeps the largest load within one tensor of the smallest. Every rank
computes the same plan from the same layouts, so no rank has to tell another what it owns.

The owner needs the pieces other ranks hold (a gather to it), and every holder needs its piece of
the result back (the reverse): both are one all-to-all, whose split sizes come from this plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


def held_range(offset: int, numel: int, shard_numel: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of a tensor's flattened elements that `rank`'s shard holds (lo == hi: none).

    The tensor sits at [offset, offset + numel) of a flat buffer cut into shards of `shard_numel`.
    """
    lo = max(offset, rank * shard_numel) - offset
    hi = min(offset + numel, (rank + 1) * shard_numel) - offset
    return (lo, hi) if lo < hi else (0, 0)


def assign_owners(numels: Sequence[int], held: Sequence[Sequence[int]], world: int) -> list[int]:
    """An owner rank for each tensor: largest first onto the least-loaded rank.

    held[i][r]: how many elements of tensor i rank r holds already (the tie-break).
    """
    load = [0] * world
    owners = [0] * len(numels)
    for index in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        owner = min(range(world), key=lambda r: (load[r], -held[index][r], r))
        owners[index] = owner
        load[owner] += numels[index]
    return owners


@attrs.frozen
class ExchangePlan:
    """Owners and pieces of one process group's tensors, seen from `rank`.

    pieces[i][r] is the [lo, hi) of tensor i that rank r holds. Pieces travel in tensor order, so
    a sender and its receiver list them alike without being told.
    """

    numels: tuple[int, ...]
    owners: tuple[int, ...]
    pieces: tuple[tuple[tuple[int, int], ...], ...]
    rank: int
    world: int

    @classmethod
    def build(cls, tensors: Sequence[tuple[int, int, int]], world: int, rank: int) -> ExchangePlan:
        """tensors: (offset in its flat buffer, numel, shard_numel of that buffer) for each tensor."""
        pieces = tuple(tuple(held_range(offset, numel, shard, r) for r in range(world))
                       for offset, numel, shard in tensors)
        numels = tuple(numel for _, numel, _ in tensors)
        held = [[hi - lo for lo, hi in per_rank] for per_rank in pieces]
        return cls(numels, tuple(assign_owners(numels, held, world)), pieces, rank, world)

    def owned(self) -> list[int]:
        """The tensors this rank computes."""
        return [i for i, owner in enumerate(self.owners) if owner == self.rank]

    def sent_to(self, destination: int) -> list[int]:
        """Tensors whose piece this rank sends to `destination` (their owner) in the gather."""
        if destination == self.rank:
            return []
        return [i for i, owner in enumerate(self.owners)
                if owner == destination and self._size(i, self.rank)]

    def received_from(self, source: int) -> list[int]:
        """Tensors this rank owns whose piece `source` holds (what it receives from it in the gather)."""
        if source == self.rank:
            return []
        return [i for i in self.owned() if self._size(i, source)]

    def send_sizes(self) -> list[int]:
        """Elements this rank sends to each rank in the gather (and receives from it in the return)."""
        return [sum(self._size(i, self.rank) for i in self.sent_to(d)) for d in range(self.world)]

    def receive_sizes(self) -> list[int]:
        """Elements this rank receives from each rank in the gather (and sends back in the return)."""
        return [sum(self._size(i, s) for i in self.received_from(s)) for s in range(self.world)]

    def loads(self) -> list[int]:
        """Elements of whole tensors each rank computes."""
        return [sum(n for n, owner in zip(self.numels, self.owners) if owner == r) for r in range(self.world)]

    def _size(self, index: int, rank: int) -> int:
        lo, hi = self.pieces[index][rank]
        return hi - lo
