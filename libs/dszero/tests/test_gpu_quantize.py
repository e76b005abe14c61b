"""On a CUDA GPU: ZeRO++'s quantized payloads are the torch path's on the CPU, byte for byte.

Every spec (int8 / int4, symmetric or not, several block sizes) over fp32, bf16 and fp16 rows, ragged
lengths, several rows, halfway points, inf and nan, and a million random values (where Triton's default
division, 2 ulp off, would move some codes and steps): the GPU's quantize (Triton where installed, the
auto choice) and the torch path run on the GPU both give the CPU torch path's payload, and dequantize
gives its values. Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1 (tools/gpu_check/run.sh --dry-run) runs
the comparisons on the CPU (the Triton kernels' CPU checks run under TRITON_INTERPRET=1 in test_quantize.py).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dszero.quantize import QuantSpec, backend, dequantize, dequantize_torch, quantize, quantize_torch

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

CHECKS = Path(__file__).parent / "triton_checks" / "check_quantize_triton.py"
SPECS = [QuantSpec(8, 256), QuantSpec(8, 64, False), QuantSpec(4, 64), QuantSpec(4, 128, False), QuantSpec(4, 8),
         QuantSpec(8, 8, False)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MANY = (1 << 20) + 3 if CUDA else (1 << 13) + 3  # the rehearsal on 2 CPU cores stays quick


def cases(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(21)
    rows = torch.randn(3, 301, generator=gen) * 10.0 ** torch.randint(-3, 3, (3, 301), generator=gen)
    rows[0, :64] = torch.arange(64) - 31.5  # halfway points: step 1 for int8's 127 levels
    rows[0, 64] = 127.0
    rows[1, 70] = float("inf")
    rows[2, 5] = float("nan")
    many = torch.randn(MANY, generator=gen) * 3.0
    return {"ragged rows": rows.to(dtype), f"one row of {MANY}": many.to(dtype), "short": rows[1, :17].to(dtype)}


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("spec", SPECS, ids=[f"int{s.bits}-{'sym' if s.symmetric else 'asym'}-b{s.block_size}"
                                             for s in SPECS])
def test_gpu_payloads_and_values_equal_the_cpu_torch_path(spec, dtype, monkeypatch):
    for name, x in cases(dtype).items():
        want = quantize_torch(x.reshape(1, -1) if x.dim() == 1 else x, spec)
        on_device = x.to(DEVICE)
        for kernels in ("auto", "torch"):
            monkeypatch.setenv("DSZERO_QUANT_KERNELS", kernels)
            if kernels == "auto" and CUDA and importlib.util.find_spec("triton") is not None:
                assert backend(on_device) == "triton"
            got = quantize(on_device, spec)
            assert got.device.type == DEVICE.type
            got = got.cpu()
            differ = (got != want).nonzero()
            assert not differ.numel(), (f"{name} ({kernels}): {differ.shape[0]} payload bytes differ from the CPU "
                                        f"torch path, first at {differ[0].tolist()}")
            numel = x.shape[-1]
            for out_dtype in DTYPES.values():
                values = dequantize(want.to(DEVICE), numel, spec, dtype=out_dtype).cpu()
                assert values.dtype == out_dtype
                assert same_values(values, dequantize_torch(want, numel, spec).to(out_dtype)), (name, kernels, out_dtype)


def test_dequantize_into_a_given_gpu_buffer():
    spec = QuantSpec(8, 64, False)
    x = cases(torch.float32)["ragged rows"]
    payload = quantize_torch(x, spec)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=DEVICE)
    got = dequantize(payload.to(DEVICE), x.shape[1], spec, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert same_values(out.cpu(), dequantize_torch(payload, x.shape[1], spec).to(torch.bfloat16))


def test_the_triton_quantizer_checks_pass_on_the_gpu():
    if not CUDA:
        pytest.skip("the CPU side of this check runs under TRITON_INTERPRET=1 in test_quantize.py")
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: the GPU's quantizers are the torch path, the Triton kernels unchecked")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(CHECKS)], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "on cuda" in run.stdout


def test_rows_past_2_31_elements_quantize_like_the_torch_path():
    """Three rows of 2**30 + 3 elements: the third starts past 2**31, where 32-bit offsets would wrap. Its
    payload and values equal the torch path's on the GPU (run on that row alone)."""
    if not CUDA:
        pytest.skip("needs a GPU with some 30 GB free; offsets are arithmetic the CPU tests cannot reach")
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: the GPU's quantizers are the torch path")
    numel, spec = (1 << 30) + 3, QuantSpec(8, 256, False)
    x = torch.randn(3, numel, device=DEVICE, dtype=torch.bfloat16, generator=torch.Generator(DEVICE).manual_seed(5))
    payload = quantize(x, spec)
    want = quantize_torch(x[2:], spec)
    assert torch.equal(payload[2:], want)
    del x
    values = dequantize(payload, numel, spec, dtype=torch.bfloat16)
    assert torch.equal(values[2], dequantize_torch(want, numel, spec).to(torch.bfloat16)[0])
    del values, payload, want
    torch.cuda.empty_cache()  # test files run side by side on one GPU: hand the memory back
