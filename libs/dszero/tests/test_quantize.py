"""ZeRO++'s blockwise quantizers hold their documented error bound, size and non-finite behaviour; the
Triton kernels produce the same payloads as the torch path."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dszero import ZeroConfigError
from dszero.quantize import QuantSpec, dequantize, error_bound, quantize

SPECS = [QuantSpec(bits, block, symmetric) for bits in (8, 4) for block in (8, 64, 256) for symmetric in (True, False)]
CHECKS = Path(__file__).parent / "triton_checks" / "check_quantize_triton.py"


def inputs():
    gen = torch.Generator().manual_seed(7)
    normal = torch.randn(4, 1000, generator=gen)
    yield "normal", normal
    yield "heavy tails", normal ** 3
    yield "magnitudes 1e-6 to 1e6 in each block", normal * 10.0 ** torch.randint(-6, 7, (4, 1000), generator=gen)
    yield "offset far from zero", 1000.0 + normal
    yield "constant and zero blocks", torch.cat([torch.full((2, 300), 3.25), torch.zeros(2, 300)], dim=1)
    yield "one element", torch.tensor([[-2.5]])
    yield "odd length", torch.randn(3, 77, generator=gen)
    yield "tiny values", normal * 1e-30


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_dequantized_values_are_within_the_documented_bound(spec):
    worst = 0.0
    for name, x in inputs():
        payload = quantize(x, spec)
        assert payload.dtype == torch.uint8 and payload.shape == (x.shape[0], spec.payload_bytes(x.shape[1]))
        values = dequantize(payload, x.shape[1], spec)
        bound = error_bound(x, spec)
        excess = (values - x).abs() - bound
        assert excess.max() <= 0, f"{name}: {excess.max()} over the bound"
        if name == "normal":
            worst = ((values - x).abs() / bound).max().item()
    # The bound is not vacuous: random data comes close to half a step somewhere.
    assert worst > 0.8


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_inputs_and_outputs_add_only_their_own_rounding(dtype):
    x = (torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)) * 100).to(dtype)
    for spec in SPECS:
        values = dequantize(quantize(x, spec), 1000, spec, dtype=dtype)
        assert values.dtype == dtype
        assert ((values.float() - x.float()).abs() <= error_bound(x, spec, dtype)).all(), spec
        into = torch.empty(3000, dtype=dtype)
        dequantize(quantize(x, spec), 1000, spec, out=into)
        assert torch.equal(into.view(3, 1000), values)


def test_the_bound_is_half_a_step_of_the_block_largest_magnitude_or_range():
    x = torch.tensor([[-1.0, 0.0, 0.25, 127.0, 3.0, 3.0, 3.0, 3.0]])
    assert error_bound(x, QuantSpec(8, 8)).max().item() == pytest.approx(127 / 254, rel=1e-3)
    assert error_bound(x, QuantSpec(4, 8)).max().item() == pytest.approx(127 / 14, rel=1e-3)
    assert error_bound(x, QuantSpec(8, 8, symmetric=False)).max().item() == pytest.approx(128 / 510, rel=1e-3)
    assert error_bound(x, QuantSpec(4, 8, symmetric=False)).max().item() == pytest.approx(128 / 30, rel=1e-3)
    # Values on the grid come back exactly.
    grid = torch.arange(-7.0, 8.0).repeat(2)[:24].view(1, 24)
    grid[0, ::8] = 7.0
    assert torch.equal(dequantize(quantize(grid, QuantSpec(4, 8)), 24, QuantSpec(4, 8)), grid)


def test_payloads_are_as_small_as_documented():
    numel = 1 << 20
    assert QuantSpec(8, 256).ratio(numel, torch.float16) > 1.96  # qwZ's default from 16-bit weights
    assert QuantSpec(4, 128).ratio(numel, torch.float16) > 3.76  # qgZ's default from 16-bit gradients
    assert QuantSpec(4, 128, symmetric=False).payload_bytes(numel) == numel // 2 + 8 * numel // 128
    assert QuantSpec(8, 8).payload_bytes(5) == 8 + 4  # codes padded to 4 bytes, one step
    assert QuantSpec(4, 8).payload_bytes(9) == 8 + 8  # 5 bytes of codes padded to 8, two steps


@pytest.mark.parametrize("spec", [QuantSpec(8, 8), QuantSpec(4, 8, symmetric=False)], ids=str)
def test_a_block_with_inf_or_nan_dequantizes_non_finite_and_leaves_the_others_alone(spec):
    for bad in (float("inf"), float("-inf"), float("nan")):
        x = torch.arange(24, dtype=torch.float32).view(1, 24)
        x[0, 10] = bad
        values = dequantize(quantize(x, spec), 24, spec)
        assert not torch.isfinite(values[0, 8:16]).any()
        finite = torch.cat([values[0, :8], values[0, 16:]])
        assert torch.isfinite(finite).all()
        assert ((finite - torch.cat([x[0, :8], x[0, 16:]])).abs() <= 16 / spec.qmax).all()


def test_bad_specs_and_payloads_are_refused_by_name():
    with pytest.raises(ZeroConfigError, match="bits = 2"):
        QuantSpec(bits=2)
    with pytest.raises(ZeroConfigError, match="block_size = 100"):
        QuantSpec(block_size=100)
    with pytest.raises(ZeroConfigError, match=r"not a .* payload of 10 elements"):
        dequantize(torch.zeros(1, 7, dtype=torch.uint8), 10, QuantSpec())


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_give_the_torch_payloads():
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # read when triton is first imported: a process of its own
    env.pop("DSZERO_QUANT_KERNELS", None)
    run = subprocess.run([sys.executable, str(CHECKS)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "triton payloads equal" in run.stdout
