"""Blockwise quantization for ZeRO++'s wire: int8 or int4, symmetric or asymmetric, per block of elements.

Each row of elements is cut into blocks of `block_size` consecutive elements (the last may be
shorter) and every block gets its own float32 step (and, asymmetric, its float32 minimum):

    symmetric:   step = max|x| / qmax          q = round(x / step) in [-qmax, qmax]    x' = q * step
    asymmetric:  step = (max x - min x) / L    q = round((x - min) / step) in [0, L]   x' = min + q * step

with qmax = 127 (int8) or 7 (int4) and L = 255 (int8) or 15 (int4). Arithmetic is float32 whatever
the input dtype.

Error bound (`error_bound` computes it per element): |x - x'| <= step / 2 + 8 * eps32 * max|x|, where
max|x| is over the element's block: half a step for rounding to the nearest level, plus a few float32
roundings of the division, product and sum. So symmetric int8 is within max|x| / 254 of the block's
largest magnitude (0.39%), int4 within max|x| / 14 (7.1%); asymmetric within (max - min) / 510 and
(max - min) / 30 of the block's range. Dequantizing into a 16-bit dtype adds that dtype's rounding,
half a unit in the last place: at most max|x| * 2**-11 (fp16) or 2**-8 (bf16). The bound holds for
finite inputs whose block range is finite in float32; a block holding inf or nan gets a non-finite
step, so every value of that block dequantizes to inf or nan (an fp16 overflow still shows after the wire).

The wire form is one uint8 row per input row: the codes (one byte each for int8, two per byte for
int4, low nibble first), padded to 4 bytes, then the blocks' float32 steps, then (asymmetric) their
float32 minimums. Codes are stored offset (q + 128 for int8, q + 8 for int4, symmetric) so that every
code is a non-negative byte or nibble. `QuantSpec.payload_bytes(numel)` is the row's size.

The functions are vectorised torch over all rows at once (no Python loop over blocks); on a GPU with
triton installed, or under TRITON_INTERPRET=1, `quantize` and `dequantize` run as Triton kernels
(quantize_triton.py) with the same codes and steps. DSZERO_QUANT_KERNELS=torch|triton|auto chooses.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from .errors import ZeroConfigError

EPS32 = torch.finfo(torch.float32).eps
KERNELS_ENV = "DSZERO_QUANT_KERNELS"


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize: `bits` 8 or 4, `block_size` elements per step (a multiple of 8), symmetric or not."""

    bits: int = 8
    block_size: int = 256
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.bits not in (4, 8) or isinstance(self.bits, bool):
            raise ZeroConfigError(f"QuantSpec.bits = {self.bits!r}: ZeRO++ quantizes to 8 or 4 bits")
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 8 \
                or self.block_size % 8:
            raise ZeroConfigError(f"QuantSpec.block_size = {self.block_size!r}: must be a positive multiple of 8 "
                                  f"(elements per quantization block), e.g. 64, 128, 256")

    @property
    def levels(self) -> int:
        """Largest code: 2**bits - 1."""
        return (1 << self.bits) - 1

    @property
    def qmax(self) -> int:
        """Largest magnitude of a symmetric code: 127 or 7."""
        return (1 << (self.bits - 1)) - 1

    @property
    def offset(self) -> int:
        """What is added to a symmetric code to store it unsigned."""
        return (1 << (self.bits - 1)) if self.symmetric else 0

    def blocks(self, numel: int) -> int:
        return -(-numel // self.block_size)

    def code_bytes(self, numel: int) -> int:
        """Bytes of codes, padded to 4 so that the float32 steps after them are aligned."""
        raw = numel if self.bits == 8 else -(-numel // 2)
        return -(-raw // 4) * 4

    def payload_bytes(self, numel: int) -> int:
        """Bytes of one quantized row of `numel` elements on the wire."""
        per_block = 4 if self.symmetric else 8
        return self.code_bytes(numel) + per_block * self.blocks(numel)

    def ratio(self, numel: int, dtype: torch.dtype) -> float:
        """How many times smaller than `numel` elements of `dtype` the payload is."""
        return numel * dtype.itemsize / self.payload_bytes(numel)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1, -1) if x.dim() == 1 else x


def _blocked(values: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """(rows, numel) -> (rows, blocks, block_size); the last block is padded with its own last value, so
    padding changes neither its largest magnitude nor its range."""
    rows, numel = values.shape
    pad = spec.blocks(numel) * spec.block_size - numel
    if pad:
        values = torch.cat([values, values[:, -1:].expand(rows, pad)], dim=1)
    return values.view(rows, -1, spec.block_size)


@functools.cache  # asked on every quantized collective; a package search each time would be wasted
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def backend(tensor: torch.Tensor) -> str:
    """'triton' or 'torch': which implementation quantizes `tensor` (DSZERO_QUANT_KERNELS overrides auto)."""
    choice = os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "torch", "triton"):
        raise ZeroConfigError(f"{KERNELS_ENV}={choice!r}: valid choices are auto, torch, triton")
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    installed = _triton_installed()
    if choice == "torch" or (choice == "auto" and not (tensor.is_cuda and installed)):
        return "torch"
    if not installed:
        raise ZeroConfigError(f"{KERNELS_ENV}=triton but triton is not installed: pip install triton")
    if not (tensor.is_cuda or interpreted):
        raise ZeroConfigError(f"{KERNELS_ENV}=triton needs a CUDA tensor (this one is on {tensor.device}) or the "
                              f"CPU interpreter (TRITON_INTERPRET=1)")
    return "triton"


def quantize(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The uint8 payload of `x` (1-D: one row; 2-D: one payload row per row)."""
    rows = _rows(x)
    if backend(rows) == "triton":
        from . import quantize_triton

        return quantize_triton.quantize(rows, spec)
    return quantize_torch(rows, spec)


def dequantize(payload: torch.Tensor, numel: int, spec: QuantSpec, dtype: torch.dtype = torch.float32,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The values of each payload row: (rows, numel) in `dtype`, written into `out` when given."""
    rows = _rows(payload)
    if rows.shape[1] != spec.payload_bytes(numel):
        raise ZeroConfigError(f"dequantize: a row of {rows.shape[1]} bytes is not a {spec} payload of {numel} "
                              f"elements ({spec.payload_bytes(numel)} bytes)")
    if backend(rows) == "triton":
        from . import quantize_triton

        values = quantize_triton.dequantize(rows, numel, spec, dtype if out is None else out.dtype)
    else:
        values = dequantize_torch(rows, numel, spec)
    if out is not None:
        return out.view(values.shape).copy_(values)
    return values.to(dtype)


def quantize_torch(rows: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    count, numel = rows.shape
    # A float32 copy of its own, worked on in place: each elementwise pass is one pass over memory.
    blocks = _blocked(rows.to(torch.float32, copy=True), spec)
    if spec.symmetric:
        # amax propagates nan and inf: a block holding one gets a non-finite step (see the module doc).
        step = blocks.abs().amax(dim=2).div_(spec.qmax)
        low = None
        q = blocks.div_(torch.where(step > 0, step, 1.0).unsqueeze(2))
        q.round_().nan_to_num_(0.0).clamp_(-spec.qmax, spec.qmax).add_(spec.offset)
    else:
        low = blocks.amin(dim=2)
        step = (blocks.amax(dim=2) - low).div_(spec.levels)
        q = blocks.sub_(low.unsqueeze(2)).div_(torch.where(step > 0, step, 1.0).unsqueeze(2))
        q.round_().nan_to_num_(0.0).clamp_(0, spec.levels)
    codes = q.view(count, -1)[:, :numel].to(torch.uint8)
    payload = torch.zeros(count, spec.payload_bytes(numel), dtype=torch.uint8, device=rows.device)
    if spec.bits == 4:
        if numel % 2:
            codes = torch.cat([codes, codes.new_zeros(count, 1)], dim=1)
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    payload[:, :codes.shape[1]] = codes
    start = spec.code_bytes(numel)
    nblocks = spec.blocks(numel)
    payload[:, start:start + 4 * nblocks].view(torch.float32).copy_(step)
    if low is not None:
        payload[:, start + 4 * nblocks:].view(torch.float32).copy_(low)
    return payload


def dequantize_torch(rows: torch.Tensor, numel: int, spec: QuantSpec) -> torch.Tensor:
    """float32 (rows, numel)."""
    count = rows.shape[0]
    start = spec.code_bytes(numel)
    nblocks = spec.blocks(numel)
    codes = rows[:, :start]
    if spec.bits == 4:
        codes = torch.stack([codes & 0xF, codes >> 4], dim=2).view(count, -1)
    q = codes[:, :numel].float()
    if spec.offset:
        q.sub_(spec.offset)
    step = rows[:, start:start + 4 * nblocks].contiguous().view(torch.float32)
    values = _blocked(q, spec).mul_(step.unsqueeze(2))
    if not spec.symmetric:
        values.add_(rows[:, start + 4 * nblocks:].contiguous().view(torch.float32).unsqueeze(2))
    return values.view(count, -1)[:, :numel]


def error_bound(x: torch.Tensor, spec: QuantSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per element of `x` (same shape), how far its dequantized value (in `dtype`) may be from it."""
    rows = _rows(x)
    count, numel = rows.shape
    blocks = _blocked(rows.float(), spec)
    largest = blocks.abs().amax(dim=2)
    if spec.symmetric:
        step = largest / spec.qmax
    else:
        step = (blocks.amax(dim=2) - blocks.amin(dim=2)) / spec.levels
    bound = step / 2 + 8 * EPS32 * largest
    if dtype != torch.float32:
        info = torch.finfo(dtype)  # half a unit in the last place, of normals and of subnormals
        bound = bound + largest * info.eps / 2 + info.smallest_normal * info.eps / 2
    return bound.unsqueeze(2).expand_as(blocks).reshape(count, -1)[:, :numel].contiguous().view(x.shape)
