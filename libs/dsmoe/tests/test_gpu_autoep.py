"""On a CUDA GPU: AutoEP's expert MLP on the Triton grouped GEMM and on torch._grouped_mm equals the
per-expert loop at bf16, forward and every gradient, both weight layouts, fused and separate gate/up, with
an expert that gets no rows and one spanning several row tiles; and the backend AutoEP picks for this GPU.

Each backend's result at bf16 is compared with the loop at bf16 on the same GPU and with the loop in
float32 on the CPU over the same bf16 values. Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1
(tools/gpu_check/run.sh --dry-run) runs the comparisons with the CPU standing in (torch._grouped_mm only:
the Triton kernel's CPU check runs under TRITON_INTERPRET=1 in test_autoep_triton.py).
"""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from dsmoe.autoep import choose_backend, expert_mlp

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

SIZES = [37, 0, 70, 9]  # an empty expert; one over two 32-row tiles; row counts that fill no tile exactly
HIDDEN, FFN = 64, 96  # multiples of 8: bf16 rows of 16-byte multiples, as torch._grouped_mm needs
BOUND = 3e-2  # bf16 against bf16 or float32: a few units in the last place of the largest value


def weights(in_out: bool, fused: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(4)
    experts = len(SIZES)

    def w(out: int, inp: int) -> torch.Tensor:
        return torch.randn((experts, inp, out) if in_out else (experts, out, inp), generator=gen) * 0.2

    w1 = w(2 * FFN if fused else FFN, HIDDEN)
    w3 = None if fused else w(FFN, HIDDEN)
    x = torch.randn(sum(SIZES), HIDDEN, generator=gen)
    return x, w1, w(HIDDEN, FFN), w3


def run(backend: str, tensors, in_out: bool, device, dtype) -> list[torch.Tensor]:
    """Forward and the gradients of x and every weight, as float32 on the CPU."""
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() if t is not None else None for t in tensors]
    y = expert_mlp(leaves[0], SIZES, leaves[1], leaves[2], leaves[3], in_out, F.silu, backend)
    ramp = torch.linspace(-1, 1, y.numel(), device=device).view_as(y)  # a gradient that is not stride 0
    (y.float() * ramp).sum().backward()
    return [t.detach().float().cpu() for t in [y, *(leaf.grad for leaf in leaves if leaf is not None)]]


def worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-6)) for g, w in zip(got, want))


@pytest.mark.parametrize("fused", [True, False], ids=["fused_gate_up", "separate_gate_up"])
@pytest.mark.parametrize("in_out", [False, True], ids=["out_in", "in_out"])
@pytest.mark.parametrize("backend", ["triton", "grouped_mm"])
def test_grouped_backend_equals_the_loop_at_bf16(backend, in_out, fused):
    if backend == "triton" and not CUDA:
        pytest.skip("the Triton kernel's CPU check runs under TRITON_INTERPRET=1 in test_autoep_triton.py")
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: AutoEP's Triton grouped GEMM went unchecked (pip install triton)")
    tensors = weights(in_out, fused)
    rounded = [t.to(torch.bfloat16).float() if t is not None else None for t in tensors]
    reference = run("loop", rounded, in_out, "cpu", torch.float32)
    loop = run("loop", tensors, in_out, DEVICE, torch.bfloat16)
    got = run(backend, tensors, in_out, DEVICE, torch.bfloat16)
    assert [g.shape for g in got] == [r.shape for r in reference]
    assert worst(loop, reference) < BOUND, "the loop itself"
    assert worst(got, loop) < BOUND, f"{backend} against the bf16 loop on {DEVICE.type}"
    assert worst(got, reference) < BOUND, f"{backend} against the float32 loop on the CPU"


def test_autoep_picks_the_grouped_kernel_this_device_runs_best():
    dims = [HIDDEN, 2 * FFN, FFN]
    chosen = choose_backend(True, False, DEVICE, torch.bfloat16, dims)
    if CUDA:
        major = torch.cuda.get_device_capability(DEVICE)[0]
        has_triton = importlib.util.find_spec("triton") is not None
        assert chosen == ("grouped_mm" if major >= 9 or not has_triton else "triton")
        assert choose_backend(True, True, DEVICE, torch.bfloat16, dims) == "grouped_mm"  # Triton disabled
    else:
        assert chosen == "grouped_mm"
    assert choose_backend(False, False, DEVICE, torch.bfloat16, dims) == "loop"


def test_triton_weight_gradient_of_a_weight_with_more_tiles_than_a_grid_axis_takes():
    """gate_up of 2 x (2048 -> 2 x 16448): 64 x 1028 = 65792 (K, N) tiles per expert, past CUDA's 65535 on
    any axis but the first: the launch itself is what is checked, and the numbers against the loop."""
    if not CUDA:
        pytest.skip("the grid limit is CUDA's; test_autoep_triton_grid.py checks the grids on the CPU")
    gen = torch.Generator().manual_seed(8)
    sizes, hidden, ffn = [40, 24], 2048, 16448
    x = (torch.randn(sum(sizes), hidden, generator=gen) * 0.1).to(DEVICE, torch.bfloat16)
    w1 = (torch.randn(2, 2 * ffn, hidden, generator=gen) * 0.02).to(DEVICE, torch.bfloat16)
    from dsmoe.autoep import grouped_matmul

    grads = []
    for backend in ("triton", "loop"):
        weight = w1.detach().clone().requires_grad_()
        y = grouped_matmul(x, weight, sizes, False, backend)
        y.float().sum().backward()
        grads.append(weight.grad.float().cpu())
    assert worst([grads[0]], [grads[1]]) < BOUND


def test_triton_grouped_gemm_addresses_an_expert_past_2_31_elements():
    """Three experts of 32768 x 32768: the third's weights start past 2**31 elements, where 32-bit
    addresses would wrap. Its rows equal the loop's."""
    if not CUDA:
        pytest.skip("needs a GPU with some 10 GB free; addresses are arithmetic the CPU tests cannot reach")
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: AutoEP's Triton grouped GEMM went unchecked")
    from dsmoe.autoep import grouped_matmul

    gen = torch.Generator(device=DEVICE).manual_seed(9)
    sizes, width = [4, 4, 40], 32768
    weight = torch.randn(3, width, width, device=DEVICE, dtype=torch.bfloat16, generator=gen) * 0.01
    x = torch.randn(sum(sizes), width, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    with torch.no_grad():
        got = grouped_matmul(x, weight, sizes, False, "triton")[8:]
        want = grouped_matmul(x[8:], weight[2:], [40], False, "loop")
    assert worst([got.float()], [want.float()]) < BOUND
    del weight
    torch.cuda.empty_cache()  # test files run side by side on one GPU: hand the memory back
