"""Which saved elements fill this rank's shard of a parameter group: a read plan.

A group saved with the same parameters (names and shapes, in order) is cut anew at the current world
size. A group whose parameters were grouped differently when saved is found parameter by parameter:
experts are the case, since a rank's expert group holds the experts it holds, and at another
expert-parallel size the same experts sit in other ranks' groups, next to other experts. Each
parameter is read from whichever saved group holds it (by name and shape), wherever that group was
partitioned, so such a checkpoint loads at any expert-parallel size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..layout import reshard_reads
from .shard_index import Entry, ShardIndex, group_key

Read = tuple[Entry, int, int, int]  # (saved entry, start in its shard, end in its shard, start in the new shard)


def read_plan(index: ShardIndex, flat: Any, rank: int) -> list[Read] | None:
    """The reads that fill `flat`'s shard of this rank, or None when a parameter is in no saved group."""
    whole = index.instances(group_key(flat.layout))
    if whole:
        saved = _prefer_own(whole, rank)
        return [(_entry(saved, old_rank), start, end, at)
                for old_rank, start, end, at in reshard_reads(next(iter(saved.values())).layout,
                                                              flat.layout.world_size, flat.shard_rank)]
    return _per_parameter(index, flat, rank)


def _per_parameter(index: ShardIndex, flat: Any, rank: int) -> list[Read] | None:
    holders: dict[tuple[str, tuple[int, ...]], tuple[tuple, Any]] = {}
    for entry in index.entries:  # every saved parameter: the group (key) and slot that hold it
        for slot in entry.layout.slots:
            holders.setdefault((slot.name, tuple(slot.shape)), (entry.key, slot))
    new_start, _ = flat.layout.shard_range(flat.shard_rank)
    plan: list[Read] = []
    for slot, lo, hi in flat.layout.pieces_in_shard(flat.shard_rank):
        found = holders.get((slot.name, tuple(slot.shape)))
        if found is None:
            return None
        key, saved_slot = found
        saved = _prefer_own(index.instances(key), rank)
        old = next(iter(saved.values())).layout
        first = saved_slot.offset + lo
        for old_rank, start, end in old.owners(first, saved_slot.offset + hi):
            old_start, _ = old.shard_range(old_rank)
            at = slot.offset + lo - new_start + (start - first)
            plan.append((_entry(saved, old_rank), start - old_start, end - old_start, at))
    return plan


def _prefer_own(found: dict[int, list[Entry]], rank: int) -> dict[int, Entry]:
    """One entry per rank of the saved process group, this rank's own file preferred."""
    own = f"zero_shard_{rank:05d}-"
    return {r: next((e for e in entries if e.file.name.startswith(own)), entries[0]) for r, entries in found.items()}


def _entry(saved: dict[int, Entry], old_rank: int) -> Entry:
    if old_rank not in saved:
        path: Path = next(iter(saved.values())).file.parent
        raise CheckpointError(f"{path}: the shard of rank {old_rank} of a parameter group is missing (its file "
                              f"is not in this directory)")
    return saved[old_rank]
