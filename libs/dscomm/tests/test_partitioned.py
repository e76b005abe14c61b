"""PartitionedTensor: a tensor split over a group's ranks, rebuilt whole from its pieces or from its meta."""

import pytest
import torch

import dscomm
from dscomm import PartitionedTensor
from dscomm.partitioned import piece_bounds
from dscomm.testing import run_ranks


def split_and_gather(rank, world, shape):
    full = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * 0.5
    part = PartitionedTensor(full, group=None)
    again = PartitionedTensor.from_meta(part.to_meta(), part.local_data, None)
    return part.local_size()[0], torch.equal(part.full(), full), torch.equal(again.full(), full)


@pytest.mark.parametrize("shape", [(16, 3), (15, 5), (2, 1)], ids=["even", "uneven", "fewer-than-ranks"])
def test_pieces_cover_the_tensor_and_gather_back_whole(shape):
    results = run_ranks(split_and_gather, 4, shape, timeout=60)
    assert sum(size for size, _, _ in results) == torch.Size(shape).numel()
    assert all(whole and from_meta for _, whole, from_meta in results)


def test_bounds_are_as_even_as_whole_elements_allow():
    assert piece_bounds(10, 4) == [0, 3, 6, 8, 10]
    assert piece_bounds(2, 4) == [0, 1, 2, 2, 2]


def a_meta_for_another_group_size(rank, world):
    meta = torch.tensor([1, 8, 4, 0, 2, 4, 6, 8])  # 4 pieces, this group has 2
    with pytest.raises(dscomm.CommError, match="describes 4 pieces; this group has 2"):
        PartitionedTensor.from_meta(meta, torch.zeros(4), None)
    return True


def test_a_meta_that_does_not_fit_the_group_is_refused_by_name():
    assert all(run_ranks(a_meta_for_another_group_size, 2, timeout=60))
