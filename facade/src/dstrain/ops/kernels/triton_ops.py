"""The fused ops of the transformer layer as Triton kernels: the GPU path.

Same functions, signatures and numbers as `torch_ops` (where dropout is off: the masks come from Triton's
Philox stream, not torch's generator). Every kernel converts what it loads to float32 at once: the
arithmetic is float32 for half inputs, and the CPU interpreter (TRITON_INTERPRET=1), which computes bfloat16
wrongly, sees no bfloat16 math. Dropout masks are a pure function of (seed, element index): backward and
recomputation draw them again instead of reading them from memory. Addresses are computed in 64 bits: a
tensor of more than 2**31 elements (the attention probabilities of long sequences) is within reach of a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The interpreter pays per program, not per element: it gets few large blocks (numpy does the rest).
_ELEMENTWISE_BLOCK = 1 << 16 if os.environ.get("TRITON_INTERPRET", "0") == "1" else 1024


@triton.jit
def _block(BLOCK: tl.constexpr):
    """This program's element offsets (64-bit) and the first one."""
    first = tl.program_id(0).to(tl.int64) * BLOCK
    return first + tl.arange(0, BLOCK), first


@triton.jit
def _columns(first, width, BLOCK: tl.constexpr):
    """The offsets' columns (offset mod width) with one 64-bit remainder per program, 32-bit ones per element."""
    return ((first % width).to(tl.int32) + tl.arange(0, BLOCK)) % width


@triton.jit
def _bias_gelu_forward_kernel(x_ptr, bias_ptr, y_ptr, numel, width, BLOCK: tl.constexpr):
    offsets, first = _block(BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
    bias = tl.load(bias_ptr + _columns(first, width, BLOCK), mask=inside).to(tl.float32)
    v = x + bias
    # tanh from exp (no tanh in triton.language); the clamp keeps exp finite (tanh(40) is 1 in float32)
    t = 1.0 - 2.0 / (tl.exp(tl.minimum(2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v), 80.0)) + 1.0)
    y = 0.5 * v * (1.0 + t)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _bias_gelu_backward_kernel(grad_ptr, x_ptr, bias_ptr, out_ptr, numel, width, BLOCK: tl.constexpr):
    offsets, first = _block(BLOCK)
    inside = offsets < numel
    grad = tl.load(grad_ptr + offsets, mask=inside).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
    bias = tl.load(bias_ptr + _columns(first, width, BLOCK), mask=inside).to(tl.float32)
    v = x + bias
    t = 1.0 - 2.0 / (tl.exp(tl.minimum(2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v), 80.0)) + 1.0)
    slope = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v)
    tl.store(out_ptr + offsets, (grad * slope).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _dropout_kernel(x_ptr, y_ptr, numel, p, seed, BLOCK: tl.constexpr):
    offsets, _ = _block(BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
    keep = tl.rand(seed, offsets) >= p
    tl.store(y_ptr + offsets, tl.where(keep, x / (1.0 - p), 0.0).to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _bias_dropout_residual_kernel(x_ptr, bias_ptr, residual_ptr, y_ptr, numel, width, p, seed,
                                  APPLY_DROPOUT: tl.constexpr, BLOCK: tl.constexpr):
    offsets, first = _block(BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
    bias = tl.load(bias_ptr + _columns(first, width, BLOCK), mask=inside).to(tl.float32)
    residual = tl.load(residual_ptr + offsets, mask=inside).to(tl.float32)
    summed = x + bias
    if APPLY_DROPOUT:
        keep = tl.rand(seed, offsets) >= p
        summed = tl.where(keep, summed / (1.0 - p), 0.0)
    tl.store(y_ptr + offsets, (summed + residual).to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _layer_norm_forward_kernel(x_ptr, weight_ptr, bias_ptr, y_ptr, mean_ptr, rstd_ptr, width, eps,
                               BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    centred = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / width + eps)
    weight = tl.load(weight_ptr + cols, mask=inside).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=inside).to(tl.float32)
    y = centred * rstd * weight + bias
    tl.store(y_ptr + row * width + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layer_norm_backward_kernel(grad_ptr, source_ptr, weight_ptr, bias_ptr, mean_ptr, rstd_ptr, grad_x_ptr,
                                partial_weight_ptr, partial_bias_ptr, rows, width, rows_per_program,
                                FROM_OUTPUT: tl.constexpr, BLOCK: tl.constexpr):
    # Each program takes a run of rows: their input gradients, and its share of the weight and bias
    # gradients (summed over programs by the caller).
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    weight = tl.load(weight_ptr + cols, mask=inside, other=1.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    acc_weight = tl.zeros([BLOCK], dtype=tl.float32)
    acc_bias = tl.zeros([BLOCK], dtype=tl.float32)
    first = program * rows_per_program
    start = first.to(tl.int64) * width  # the row's first element, 64-bit, moved along with the row
    for row in range(first, tl.minimum(first + rows_per_program, rows)):
        grad = tl.load(grad_ptr + start + cols, mask=inside, other=0.0).to(tl.float32)
        source = tl.load(source_ptr + start + cols, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if FROM_OUTPUT:
            x_hat = tl.where(inside, (source - bias) / weight, 0.0)
        else:
            x_hat = tl.where(inside, (source - tl.load(mean_ptr + row)) * rstd, 0.0)
        scaled = grad * weight
        c1 = tl.sum(scaled * x_hat, axis=0) / width
        c2 = tl.sum(scaled, axis=0) / width
        grad_x = (scaled - (x_hat * c1 + c2)) * rstd
        tl.store(grad_x_ptr + start + cols, grad_x.to(grad_x_ptr.dtype.element_ty), mask=inside)
        acc_weight += grad * x_hat
        acc_bias += grad
        start += width
    tl.store(partial_weight_ptr + program * width + cols, acc_weight, mask=inside)
    tl.store(partial_bias_ptr + program * width + cols, acc_bias, mask=inside)


@triton.jit
def _softmax_dropout_forward_kernel(scores_ptr, mask_ptr, probs_ptr, dropped_ptr, length, rows_per_batch,
                                    scale, p, seed, HAS_MASK: tl.constexpr, APPLY_DROPOUT: tl.constexpr,
                                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < length
    logits = tl.load(scores_ptr + row * length + cols, mask=inside, other=0.0).to(tl.float32) * scale
    if HAS_MASK:
        batch = row // rows_per_batch
        logits += tl.load(mask_ptr + batch * length + cols, mask=inside, other=0.0).to(tl.float32)
    logits = tl.where(inside, logits, float("-inf"))
    exps = tl.exp(logits - tl.max(logits, axis=0))
    probs = exps / tl.sum(exps, axis=0)
    tl.store(probs_ptr + row * length + cols, probs.to(probs_ptr.dtype.element_ty), mask=inside)
    if APPLY_DROPOUT:
        keep = tl.rand(seed, row * length + cols) >= p
        dropped = tl.where(keep, probs / (1.0 - p), 0.0)
        tl.store(dropped_ptr + row * length + cols, dropped.to(dropped_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _softmax_dropout_backward_kernel(grad_ptr, probs_ptr, out_ptr, length, scale, p, seed,
                                     APPLY_DROPOUT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < length
    grad = tl.load(grad_ptr + row * length + cols, mask=inside, other=0.0).to(tl.float32)
    probs = tl.load(probs_ptr + row * length + cols, mask=inside, other=0.0).to(tl.float32)
    if APPLY_DROPOUT:
        keep = tl.rand(seed, row * length + cols) >= p
        grad = tl.where(keep, grad / (1.0 - p), 0.0)
    inner = tl.sum(grad * probs, axis=0)
    tl.store(out_ptr + row * length + cols, (scale * probs * (grad - inner)).to(out_ptr.dtype.element_ty),
             mask=inside)


def _grid(numel: int) -> tuple[int]:
    return (triton.cdiv(numel, _ELEMENTWISE_BLOCK),)


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    if p == 0:
        return x
    x = x.contiguous()
    y = torch.empty_like(x)
    _dropout_kernel[_grid(x.numel())](x, y, x.numel(), p, seed, BLOCK=_ELEMENTWISE_BLOCK)
    return y


def bias_gelu_forward(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _bias_gelu_forward_kernel[_grid(x.numel())](x, bias.contiguous(), y, x.numel(), bias.numel(),
                                                BLOCK=_ELEMENTWISE_BLOCK)
    return y


def bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    _bias_gelu_backward_kernel[_grid(x.numel())](grad.contiguous(), x, bias.contiguous(), out, x.numel(),
                                                 bias.numel(), BLOCK=_ELEMENTWISE_BLOCK)
    return out


def bias_dropout_residual_forward(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: float,
                                  seed: int) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _bias_dropout_residual_kernel[_grid(x.numel())](x, bias.contiguous(), residual.contiguous(), y, x.numel(),
                                                    bias.numel(), p, seed, APPLY_DROPOUT=p > 0,
                                                    BLOCK=_ELEMENTWISE_BLOCK)
    return y


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    rows, width = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    _layer_norm_forward_kernel[(rows,)](x, weight.contiguous(), bias.contiguous(), y, mean, rstd, width, eps,
                                        BLOCK=triton.next_power_of_2(width))
    return y, mean, rstd


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor | None,
                        weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor | None,
                        rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    source = (x if x is not None else y).contiguous()
    rows, width = source.shape
    programs = max(1, min(rows, 256))
    rows_per_program = triton.cdiv(rows, programs)
    programs = triton.cdiv(rows, rows_per_program)
    grad_x = torch.empty_like(source)
    partial_weight = torch.empty(programs, width, dtype=torch.float32, device=source.device)
    partial_bias = torch.empty_like(partial_weight)
    _layer_norm_backward_kernel[(programs,)](
        grad.contiguous(), source, weight.contiguous(), bias.contiguous(), mean if mean is not None else rstd,
        rstd, grad_x, partial_weight, partial_bias, rows, width, rows_per_program, FROM_OUTPUT=x is None,
        BLOCK=triton.next_power_of_2(width))
    return grad_x, partial_weight.sum(0).to(weight.dtype), partial_bias.sum(0).to(bias.dtype)


def softmax_dropout_forward(scores: torch.Tensor, mask: torch.Tensor | None, scale: float, p: float,
                            seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores = scores.contiguous()
    batch, heads, queries, length = scores.shape
    probs = torch.empty_like(scores)
    dropped = torch.empty_like(scores) if p > 0 else probs
    mask_arg = mask.contiguous() if mask is not None else scores
    _softmax_dropout_forward_kernel[(batch * heads * queries,)](
        scores, mask_arg, probs, dropped, length, heads * queries, scale, p, seed, HAS_MASK=mask is not None,
        APPLY_DROPOUT=p > 0, BLOCK=triton.next_power_of_2(length))
    return probs, dropped


def softmax_dropout_backward(grad_dropped: torch.Tensor, probs: torch.Tensor, scale: float, p: float,
                             seed: int) -> torch.Tensor:
    probs = probs.contiguous()
    length = probs.shape[-1]
    out = torch.empty_like(probs)
    _softmax_dropout_backward_kernel[(probs.numel() // length,)](
        grad_dropped.contiguous(), probs, out, length, scale, p, seed, APPLY_DROPOUT=p > 0,
        BLOCK=triton.next_power_of_2(length))
    return out
