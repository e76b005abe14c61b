"""The Triton quantizers' launch grid fits CUDA's limits (65535 programs on every axis but the first) for
the shards ZeRO++ quantizes, however large: the CPU interpreter has no such limit, so only this shows it."""

import pytest

pytest.importorskip("triton")

from dszero.errors import ZeroError
from dszero.quantize import QuantSpec
from dszero.quantize_triton import CUDA_GRID_LIMITS, grid


@pytest.mark.parametrize("numel", [1, 65535 * 8, 58_720_256, 2**31 - 1])  # 58.7M: one Mixtral expert's weights
@pytest.mark.parametrize("rows", [1, 8, 4096])
def test_every_axis_stays_within_cudas_limits(numel, rows):
    for spec in (QuantSpec(8, 8), QuantSpec(4, 256)):
        launch = grid(rows, spec.blocks(numel))
        assert launch == (spec.blocks(numel), rows)
        assert all(size <= limit for size, limit in zip(launch, CUDA_GRID_LIMITS))


def test_more_rows_than_an_axis_takes_is_refused_by_name():
    with pytest.raises(ZeroError, match="65536 rows"):
        grid(65536, 1)
