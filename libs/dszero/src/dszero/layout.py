"""Where every parameter lives in a flat buffer and which rank owns which slice (pure Python).

A parameter group is flattened into one buffer, parameters back to back in order, padded at the
end so it splits into `world_size` equal shards; rank r owns elements [r * shard, (r + 1) * shard).
A checkpoint records the unpadded layout, so a different world size can cut the same elements
into different shards.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class Slot:
    """One parameter's place in its group's flat buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int

    @property
    def end(self) -> int:
        return self.offset + self.numel


@attrs.frozen
class GroupLayout:
    slots: tuple[Slot, ...]
    world_size: int
    alignment: int = 1  # shard sizes are multiples of this (elements)

    @classmethod
    def build(cls, names: Sequence[str], shapes: Sequence[Sequence[int]], world_size: int,
              alignment: int = 1) -> GroupLayout:
        slots, offset = [], 0
        for name, shape in zip(names, shapes):
            numel = 1
            for dim in shape:
                numel *= int(dim)
            slots.append(Slot(name, tuple(int(d) for d in shape), offset, numel))
            offset += numel
        return cls(tuple(slots), world_size, alignment)

    @property
    def numel(self) -> int:
        """Elements of the parameters themselves (no padding)."""
        return self.slots[-1].end if self.slots else 0

    @property
    def shard_numel(self) -> int:
        per_rank = -(-self.numel // self.world_size)  # ceil
        return -(-per_rank // self.alignment) * self.alignment

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of rank's shard in the padded flat buffer."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def pieces_in_shard(self, rank: int) -> list[tuple[Slot, int, int]]:
        """(slot, start within the slot, end within the slot) for each parameter piece rank owns."""
        lo, hi = self.shard_range(rank)
        found = []
        for slot in self.slots:
            start, end = max(lo, slot.offset), min(hi, slot.end)
            if start < end:
                found.append((slot, start - slot.offset, end - slot.offset))
        return found

    def owners(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(rank, start, end) pieces of the flat range [start, end), split at shard boundaries."""
        found = []
        shard = self.shard_numel
        pos = start
        while pos < end:
            rank = pos // shard
            piece_end = min(end, (rank + 1) * shard)
            found.append((rank, pos, piece_end))
            pos = piece_end
        return found


def reshard_reads(old: GroupLayout, new_world_size: int, new_rank: int) -> list[tuple[int, int, int, int]]:
    """What rank `new_rank` of a `new_world_size` world must read from an `old` checkpoint.

    Returns (old rank, start in that old shard, end in that old shard, start in the new shard) for
    each piece of the new shard's real (unpadded) elements.
    """
    new = attrs.evolve(old, world_size=new_world_size)
    lo, hi = new.shard_range(new_rank)
    hi = min(hi, old.numel)
    reads = []
    for old_rank, start, end in old.owners(lo, hi) if lo < hi else []:
        old_lo, _ = old.shard_range(old_rank)
        reads.append((old_rank, start - old_lo, end - old_lo, start - lo))
    return reads
