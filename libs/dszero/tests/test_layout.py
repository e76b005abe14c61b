"""Flat layouts and resharding reads: pure arithmetic, checked exhaustively on small cases."""

import itertools

import pytest

from dszero import GroupLayout
from dszero.layout import reshard_reads


def layout(world, shapes=((3, 4), (5,), (2, 2, 2)), alignment=1):
    return GroupLayout.build([f"p{i}" for i in range(len(shapes))], shapes, world, alignment)


def test_slots_are_back_to_back_and_shards_cover_them():
    lay = layout(3)
    assert [(s.offset, s.numel) for s in lay.slots] == [(0, 12), (12, 5), (17, 8)]
    assert lay.numel == 25 and lay.shard_numel == 9 and lay.padded_numel == 27
    owned = sorted((slot.offset + a, slot.offset + b) for r in range(3) for slot, a, b in lay.pieces_in_shard(r))
    assert owned[0][0] == 0 and owned[-1][1] == 25
    assert sum(b - a for a, b in owned) == 25


def test_alignment_rounds_shards_up():
    assert layout(2, alignment=4).shard_numel == 16
    assert layout(4, alignment=4).shard_numel == 8


def test_owners_split_at_shard_boundaries():
    lay = layout(3)
    assert lay.owners(5, 20) == [(0, 5, 9), (1, 9, 18), (2, 18, 20)]


@pytest.mark.parametrize(("old_world", "new_world"), list(itertools.product([1, 2, 3, 4], repeat=2)))
def test_reshard_reads_move_every_element_exactly_once(old_world, new_world):
    old = layout(old_world, alignment=2)
    # Each element's value is its position in the unpadded flat buffer.
    old_shards = []
    for rank in range(old_world):
        lo, hi = old.shard_range(rank)
        old_shards.append([i if i < old.numel else -1 for i in range(lo, hi)])
    new = GroupLayout(old.slots, new_world, old.alignment)
    rebuilt = []
    for rank in range(new_world):
        shard = [-1] * new.shard_numel
        for old_rank, start, end, at in reshard_reads(old, new_world, rank):
            shard[at:at + end - start] = old_shards[old_rank][start:end]
        rebuilt.extend(shard)
    assert rebuilt[:old.numel] == list(range(old.numel))
    assert all(v == -1 for v in rebuilt[old.numel:])  # padding stays empty
