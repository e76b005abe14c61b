"""quantize.py's quantizers as Triton kernels: the GPU path (tested on the CPU under TRITON_INTERPRET=1).

One program per (block, row): it finds the block's step (and minimum), rounds half to even as torch
does, and writes the block's codes, two per byte for int4; torch only lays codes and steps out in the
payload. Codes, steps and dequantized values are the same as quantize.py's torch path: on a GPU that needs
the IEEE division (`div_rn`; Triton's `/` is `div.full.f32`, up to 2 ulp off) and no fused multiply-add
(`enable_fp_fusion=False`: torch multiplies and adds as two roundings). Blocks run along the grid's
first axis, the only one CUDA lets past 65535 programs: one row of a large shard has millions of blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .errors import ZeroError
from .quantize import QuantSpec


@triton.jit
def _round_half_even(v):
    low = tl.floor(v)
    frac = v - low
    odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, low + 1.0, low)


@triton.jit
def _block_stats(x_ptr, row_start, numel, block_start, BLOCK: tl.constexpr, SYMMETRIC: tl.constexpr, QMAX, LEVELS):
    offsets = block_start + tl.arange(0, BLOCK)
    inside = offsets < numel
    last = tl.load(x_ptr + row_start + numel - 1).to(tl.float32)  # padding: the row's last value, as torch's
    x = tl.where(inside, tl.load(x_ptr + row_start + offsets, mask=inside, other=0.0).to(tl.float32), last)
    has_nan = tl.max((x != x).to(tl.int32), axis=0) > 0  # tl.max may skip nan; torch.amax propagates it
    if SYMMETRIC:
        step = tl.math.div_rn(tl.max(tl.abs(x), axis=0), QMAX)
        low = 0.0
    else:
        low = tl.min(x, axis=0)
        step = tl.math.div_rn(tl.max(x, axis=0) - low, LEVELS)
        low = tl.where(has_nan, float("nan"), low)
    step = tl.where(has_nan, float("nan"), step)
    return step, low


@triton.jit
def _codes_of(x, step, low, SYMMETRIC: tl.constexpr, QMAX, LEVELS, OFFSET):
    safe = tl.where(step > 0, step, 1.0)
    if SYMMETRIC:
        q = _round_half_even(tl.math.div_rn(x, safe))
        q = tl.where(q != q, 0.0, q)
        q = tl.minimum(tl.maximum(q, -QMAX), QMAX) + OFFSET
    else:
        q = _round_half_even(tl.math.div_rn(x - low, safe))
        q = tl.where(q != q, 0.0, q)
        q = tl.minimum(tl.maximum(q, 0.0), LEVELS)
    return q.to(tl.int32)


@triton.jit
def _quantize_kernel(x_ptr, codes_ptr, step_ptr, low_ptr, numel, x_stride, codes_stride, blocks,
                     BLOCK: tl.constexpr, FOUR_BITS: tl.constexpr, SYMMETRIC: tl.constexpr, QMAX, LEVELS, OFFSET):
    block = tl.program_id(0).to(tl.int64)  # 64-bit addresses: rows of rank-sized shards pass 2**31 bytes
    row = tl.program_id(1).to(tl.int64)
    row_start = row * x_stride
    block_start = block * BLOCK
    step, low = _block_stats(x_ptr, row_start, numel, block_start, BLOCK, SYMMETRIC, QMAX, LEVELS)
    tl.store(step_ptr + row * blocks + block, step)
    if not SYMMETRIC:
        tl.store(low_ptr + row * blocks + block, low)
    if FOUR_BITS:
        pairs = block_start + 2 * tl.arange(0, BLOCK // 2)
        even_in = pairs < numel
        odd_in = pairs + 1 < numel
        even = tl.load(x_ptr + row_start + pairs, mask=even_in, other=0.0).to(tl.float32)
        odd = tl.load(x_ptr + row_start + pairs + 1, mask=odd_in, other=0.0).to(tl.float32)
        low_code = _codes_of(even, step, low, SYMMETRIC, QMAX, LEVELS, OFFSET)
        high_code = tl.where(odd_in, _codes_of(odd, step, low, SYMMETRIC, QMAX, LEVELS, OFFSET), 0)
        tl.store(codes_ptr + row * codes_stride + pairs // 2, (low_code | (high_code << 4)).to(tl.uint8),
                 mask=even_in)
    else:
        offsets = block_start + tl.arange(0, BLOCK)
        inside = offsets < numel
        x = tl.load(x_ptr + row_start + offsets, mask=inside, other=0.0).to(tl.float32)
        codes = _codes_of(x, step, low, SYMMETRIC, QMAX, LEVELS, OFFSET)
        tl.store(codes_ptr + row * codes_stride + offsets, codes.to(tl.uint8), mask=inside)


@triton.jit
def _dequantize_kernel(codes_ptr, step_ptr, low_ptr, out_ptr, numel, codes_stride, blocks,
                       BLOCK: tl.constexpr, FOUR_BITS: tl.constexpr, SYMMETRIC: tl.constexpr, OFFSET):
    block = tl.program_id(0).to(tl.int64)  # 64-bit addresses: rows of rank-sized shards pass 2**31 bytes
    row = tl.program_id(1).to(tl.int64)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    if FOUR_BITS:
        packed = tl.load(codes_ptr + row * codes_stride + offsets // 2, mask=inside, other=0).to(tl.int32)
        codes = tl.where((offsets % 2) == 0, packed & 15, packed >> 4)
    else:
        codes = tl.load(codes_ptr + row * codes_stride + offsets, mask=inside, other=0).to(tl.int32)
    step = tl.load(step_ptr + row * blocks + block)
    values = (codes - OFFSET).to(tl.float32) * step
    if not SYMMETRIC:
        values = values + tl.load(low_ptr + row * blocks + block)
    tl.store(out_ptr + row * numel + offsets, values.to(out_ptr.dtype.element_ty), mask=inside)


CUDA_GRID_LIMITS = (2**31 - 1, 65535, 65535)  # programs per grid axis


def grid(count: int, blocks: int) -> tuple[int, int]:
    """(blocks, rows): every block of every row, blocks first (see the module doc)."""
    if count > CUDA_GRID_LIMITS[1]:
        raise ZeroError(f"quantize: {count} rows in one call; the GPU kernels take at most {CUDA_GRID_LIMITS[1]} "
                        "(ZeRO++ quantizes one row per rank)")
    return (blocks, count)


def quantize(rows: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    rows = rows.contiguous()
    count, numel = rows.shape
    blocks = spec.blocks(numel)
    start = spec.code_bytes(numel)
    payload = torch.zeros(count, spec.payload_bytes(numel), dtype=torch.uint8, device=rows.device)
    codes = torch.zeros(count, start, dtype=torch.uint8, device=rows.device)
    steps = torch.empty(count, blocks, dtype=torch.float32, device=rows.device)
    lows = torch.empty(count, blocks if not spec.symmetric else 1, dtype=torch.float32, device=rows.device)
    _quantize_kernel[grid(count, blocks)](rows, codes, steps, lows, numel, rows.stride(0), start, blocks,
                                      BLOCK=spec.block_size, FOUR_BITS=spec.bits == 4, SYMMETRIC=spec.symmetric,
                                      QMAX=float(spec.qmax), LEVELS=float(spec.levels), OFFSET=spec.offset,
                                      enable_fp_fusion=False)
    payload[:, :start] = codes
    payload[:, start:start + 4 * blocks].view(torch.float32).copy_(steps)
    if not spec.symmetric:
        payload[:, start + 4 * blocks:].view(torch.float32).copy_(lows)
    return payload


def dequantize(rows: torch.Tensor, numel: int, spec: QuantSpec, dtype: torch.dtype) -> torch.Tensor:
    count = rows.shape[0]
    blocks = spec.blocks(numel)
    start = spec.code_bytes(numel)
    codes = rows[:, :start].contiguous()
    steps = rows[:, start:start + 4 * blocks].contiguous().view(torch.float32)
    lows = rows[:, start + 4 * blocks:].contiguous().view(torch.float32) if not spec.symmetric else steps
    out = torch.empty(count, numel, dtype=dtype, device=rows.device)
    _dequantize_kernel[grid(count, blocks)](codes, steps, lows, out, numel, start, blocks, BLOCK=spec.block_size,
                                        FOUR_BITS=spec.bits == 4, SYMMETRIC=spec.symmetric, OFFSET=spec.offset,
                                        enable_fp_fusion=False)
    return out
