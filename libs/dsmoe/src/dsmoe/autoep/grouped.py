"""The experts' SwiGLU MLPs over tokens sorted by expert, with one matmul per projection for all local
experts: `torch._grouped_mm`, a Triton grouped GEMM, or a per-expert loop (the reference).

Expert weights keep the Hugging Face layout they came in: [experts, out, in] ("out_in", what
F.linear takes; transformers 5's gate_up_proj [E, 2F, H] and down_proj [E, H, F]) or [experts, in, out]
("in_out"). Gate and up are one fused weight (gate first) or two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..errors import MoEError

BACKENDS = ("loop", "grouped_mm", "triton")


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient: _grouped_mm's backward rejects the
    stride-0 gradient a sum() or an expand gives it."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, sizes: Sequence[int], in_out: bool, backend: str
                   ) -> torch.Tensor:
    """Rows sizes[0] of x times expert 0's weight, the next sizes[1] rows times expert 1's, ..."""
    if backend == "loop":
        pieces, start = [], 0
        for expert, size in enumerate(sizes):
            w = weight[expert] if in_out else weight[expert].t()
            pieces.append(x[start:start + size] @ w)
            start += size
        return torch.cat(pieces) if pieces else x.new_zeros((0, weight.shape[2 if in_out else 1]))
    if backend == "triton":
        from .triton_grouped import triton_grouped_mm
        return triton_grouped_mm(x, weight, sizes, in_out)
    offsets = torch.tensor(list(sizes), dtype=torch.int32, device=x.device).cumsum(0, dtype=torch.int32)
    b = weight if in_out else weight.transpose(1, 2)
    return _ContiguousGrad.apply(torch._grouped_mm(x.contiguous(), b, offs=offsets))


def expert_mlp(x: torch.Tensor, sizes: Sequence[int], w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor | None,
               in_out: bool, act: Callable[[torch.Tensor], torch.Tensor], backend: str) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) of each row's expert; rows sorted by local expert, sizes per expert."""
    if w3 is None:
        gate, up = grouped_matmul(x, w1, sizes, in_out, backend).chunk(2, dim=-1)
    else:
        gate, up = grouped_matmul(x, w1, sizes, in_out, backend), grouped_matmul(x, w3, sizes, in_out, backend)
    return grouped_matmul(act(gate) * up, w2, sizes, in_out, backend)


# ------------------------------------------------------------------------------------------ backend choice
def grouped_mm_available() -> bool:
    return hasattr(torch, "_grouped_mm")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def grouped_mm_fits(dtype: torch.dtype, dims: Sequence[int]) -> bool:
    """torch._grouped_mm takes float32/bfloat16/float16 with every row stride a multiple of 16 bytes."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    per_16_bytes = 16 // dtype.itemsize
    return all(d % per_16_bytes == 0 for d in dims)


def choose_backend(use_grouped_mm: bool, disable_triton: bool, device: torch.device, dtype: torch.dtype,
                   dims: Sequence[int], requested: str | None = None) -> str:
    """The expert compute backend, as the reference picks it: the loop when use_grouped_mm is false;
    else on a GPU of compute capability >= 9.0 torch._grouped_mm, below that the Triton kernel (unless
    disable_triton_grouped_mm), else torch._grouped_mm; on the CPU torch._grouped_mm. Shapes or dtypes
    the grouped kernels cannot take (float64, rows not 16-byte aligned) run the loop. `requested`
    names one backend outright (tests, benchmarks)."""
    if requested is not None:
        if requested not in BACKENDS:
            raise MoEError(f"expert backend {requested!r} is not one of {', '.join(BACKENDS)}")
        if requested == "triton" and not triton_available():
            raise MoEError("expert backend 'triton' needs the triton package, which is not installed "
                           "(set expert_parallel.disable_triton_grouped_mm: true, or install triton)")
        if requested == "grouped_mm" and not grouped_mm_available():
            raise MoEError("expert backend 'grouped_mm' needs torch._grouped_mm, which this torch lacks")
        return requested
    if not use_grouped_mm:
        return "loop"
    has_torch, has_triton = grouped_mm_available(), triton_available() and not disable_triton
    if not has_torch and not has_triton:
        raise MoEError("expert_parallel.use_grouped_mm is true but neither torch._grouped_mm nor Triton is "
                       "available; install triton or set expert_parallel.use_grouped_mm: false")
    fits = grouped_mm_fits(dtype, dims)
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device)[0] < 9 and has_triton:
            return "triton"
        return "grouped_mm" if has_torch and fits else ("triton" if has_triton else "loop")
    return "grouped_mm" if has_torch and fits else "loop"
