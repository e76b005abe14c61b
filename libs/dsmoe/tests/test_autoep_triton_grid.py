"""The Triton grouped GEMM's launch grids fit CUDA's limits (65535 programs on every axis but the first) at
the Mixtral shape and beyond: the CPU interpreter has no such limit, so only this shows it."""

import pytest

pytest.importorskip("triton")

from dsmoe.autoep.triton_grouped import matmul_grid, weight_grad_grid

LIMITS = (2**31 - 1, 65535, 65535)


@pytest.mark.parametrize("experts,hidden,ffn", [(8, 4096, 14336), (256, 7168, 2048), (1, 16384, 53248)],
                         ids=["mixtral", "deepseek_v3", "one_wide_expert"])
def test_grids_stay_within_cudas_limits(experts, hidden, ffn):
    for k_dim, n_cols in ((hidden, 2 * ffn), (ffn, hidden), (2 * ffn, hidden)):  # gate_up, down, and dx's
        grid = weight_grad_grid(experts, k_dim, n_cols)
        assert grid[1] == experts and all(size <= limit for size, limit in zip(grid, LIMITS)), grid
        rows = 65536 * 8  # tokens x top-k
        grid = matmul_grid(rows // 32 + experts, n_cols)
        assert all(size <= limit for size, limit in zip(grid, LIMITS)), grid
    assert weight_grad_grid(8, 4096, 28672)[0] == 128 * 896  # the Mixtral gate_up gradient: 114688 tiles
