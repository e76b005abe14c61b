"""A Triton grouped GEMM for the experts: rows sorted by expert times each expert's weight, and its
backward (the input gradient is the same kernel over the transposed weights; the weight gradient a
second kernel summing each expert's rows).

The host turns the per-expert row counts into a list of (expert, first row) tiles, so no program
works on an empty expert and every program's rows belong to one expert. Operands are upcast to
float32 after loading where the dot would otherwise run in low precision on the CPU interpreter
(TRITON_INTERPRET=1, which computes bfloat16 dots wrongly) and for float32 inputs (no TF32), and
accumulate in float32 always.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32


@triton.jit
def _grouped_mm_kernel(x_ptr, w_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr, n_cols, k_dim,
                       sxm, sxk, swe, swk, swn, som, son, UPCAST: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr):
    tile = tl.program_id(0)
    # 64-bit addresses: an expert's weights times its index, or rows times the hidden size, pass 2**31
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    row0 = tl.load(tile_row_ptr + tile).to(tl.int64)
    row_end = tl.load(expert_end_ptr + expert)
    rows = row0 + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok = rows < row_end
    col_ok = cols < n_cols
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k_dim, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < k_dim
        a = tl.load(x_ptr + rows[:, None] * sxm + ks[None, :] * sxk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + expert * swe + ks[:, None] * swk + cols[None, :] * swn,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :] * son, acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _grouped_wgrad_kernel(x_ptr, dy_ptr, dw_ptr, expert_start_ptr, expert_end_ptr, k_dim, n_cols,
                          sxm, sxk, sym, syn, sde, sdk, sdn, UPCAST: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr):
    tile = tl.program_id(0)  # the (K, N) tiles on the first axis: CUDA caps the others at 65535 programs
    expert = tl.program_id(1).to(tl.int64)
    tiles_n = tl.cdiv(n_cols, BN)
    ks = (tile // tiles_n) * BK + tl.arange(0, BK)
    cols = (tile % tiles_n) * BN + tl.arange(0, BN)
    k_ok = ks < k_dim
    col_ok = cols < n_cols
    start = tl.load(expert_start_ptr + expert).to(tl.int64)
    end = tl.load(expert_end_ptr + expert).to(tl.int64)
    acc = tl.zeros((BK, BN), dtype=tl.float32)
    for m0 in range(start, end, BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < end
        a = tl.load(x_ptr + rows[:, None] * sxm + ks[None, :] * sxk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(dy_ptr + rows[:, None] * sym + cols[None, :] * syn, mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            g = g.to(tl.float32)
            acc += tl.dot(tl.trans(a), g, input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(a), g)
    tl.store(dw_ptr + expert * sde + ks[:, None] * sdk + cols[None, :] * sdn, acc.to(dw_ptr.dtype.element_ty),
             mask=k_ok[:, None] & col_ok[None, :])


def weight_grad_grid(experts: int, k_dim: int, n_cols: int) -> tuple[int, int]:
    """(K x N tiles, experts): a Mixtral-sized weight has over 65535 tiles, more than CUDA's second axis takes."""
    return (triton.cdiv(k_dim, BLOCK_K) * triton.cdiv(n_cols, BLOCK_N), experts)


def matmul_grid(tiles: int, n_cols: int) -> tuple[int, int]:
    """(row tiles, N tiles): row tiles unbounded on the first axis; N / BLOCK_N stays far below 65535."""
    return (tiles, triton.cdiv(n_cols, BLOCK_N))


def _upcast(dtype: torch.dtype) -> bool:
    return dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"


def _schedule(sizes: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
    starts, tile_expert, tile_row, row = [], [], [], 0
    for expert, size in enumerate(sizes):
        starts.append(row)
        for first in range(row, row + size, BLOCK_M):
            tile_expert.append(expert)
            tile_row.append(first)
        row += size
    ends = [s + n for s, n in zip(starts, sizes)]

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return as_tensor(tile_expert), as_tensor(tile_row), as_tensor(starts), as_tensor(ends)


def _matmul(x: torch.Tensor, b: torch.Tensor, sizes: Sequence[int], schedule: tuple) -> torch.Tensor:
    """out[rows of expert e] = x[rows of e] @ b[e], b given as any-strided [E, K, N]."""
    tile_expert, tile_row, _, ends = schedule
    out = x.new_empty((x.shape[0], b.shape[2]))
    if tile_expert.numel():
        grid = matmul_grid(tile_expert.numel(), b.shape[2])
        _grouped_mm_kernel[grid](x, b, out, tile_expert, tile_row, ends, b.shape[2], b.shape[1],
                                 x.stride(0), x.stride(1), b.stride(0), b.stride(1), b.stride(2),
                                 out.stride(0), out.stride(1), UPCAST=_upcast(x.dtype), BM=BLOCK_M, BN=BLOCK_N,
                                 BK=BLOCK_K)
    return out


def _weight_grad(x: torch.Tensor, dy: torch.Tensor, experts: int, schedule: tuple) -> torch.Tensor:
    """[E, K, N]: each expert's x rows transposed times its dy rows (zero for an expert without rows)."""
    _, _, starts, ends = schedule
    k_dim, n_cols = x.shape[1], dy.shape[1]
    dw = torch.empty((experts, k_dim, n_cols), dtype=x.dtype, device=x.device)
    grid = weight_grad_grid(experts, k_dim, n_cols)
    _grouped_wgrad_kernel[grid](x, dy, dw, starts, ends, k_dim, n_cols, x.stride(0), x.stride(1),
                                dy.stride(0), dy.stride(1), dw.stride(0), dw.stride(1), dw.stride(2),
                                UPCAST=_upcast(x.dtype), BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K)
    return dw


class _TritonGroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, sizes: Sequence[int], in_out: bool) -> torch.Tensor:
        schedule = _schedule(sizes, x.device)
        b = weight if in_out else weight.transpose(1, 2)  # [E, K, N] view: no copy
        ctx.save_for_backward(x, weight)
        ctx.schedule, ctx.in_out = schedule, in_out
        return _matmul(x, b, sizes, schedule)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        b = weight if ctx.in_out else weight.transpose(1, 2)
        dx = _matmul(grad, b.transpose(1, 2), (), ctx.schedule) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            db = _weight_grad(x, grad, weight.shape[0], ctx.schedule)
            dw = db if ctx.in_out else db.transpose(1, 2).contiguous()
        return dx, dw, None, None


def triton_grouped_mm(x: torch.Tensor, weight: torch.Tensor, sizes: Sequence[int], in_out: bool) -> torch.Tensor:
    """Rows sizes[e] of x (sorted by expert) times expert e's weight ([E, in, out] if in_out, else
    [E, out, in] as F.linear takes it)."""
    return _TritonGroupedMM.apply(x.contiguous(), weight, list(sizes), in_out)
