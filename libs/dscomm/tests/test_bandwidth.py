"""The nccl-tests conventions for message size and bus bandwidth."""

import pytest

from dscomm.bandwidth import bandwidths, bus_factor, size_str


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_gather_into_tensor", 4, 0.75), ("reduce_scatter_tensor", 4, 0.75), ("all_to_all_single", 2, 0.5),
    ("broadcast", 8, 1.0), ("send", 2, 1.0), ("reduce", 4, 1.0), ("all_reduce", 1, 0.0),
])
def test_bus_factor(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_bandwidths_from_bytes_and_milliseconds():
    algbw, busbw = bandwidths("all_reduce", nbytes=1_000_000_000, latency_ms=500.0, group_size=4)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(3.0)
    assert bandwidths("all_reduce", 10, 0.0, 2) == (0.0, 0.0)


def test_size_str():
    assert [size_str(n) for n in (12, 1024, 1536, 64 << 20)] == ["12 B", "1 KiB", "1.50 KiB", "64 MiB"]
