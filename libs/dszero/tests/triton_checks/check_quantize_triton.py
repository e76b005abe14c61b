"""Run as a script by test_quantize.py: the Triton quantizers give the torch path's payloads and values,
on a CUDA device where there is one, else in Triton's CPU interpreter (TRITON_INTERPRET=1 set before
triton is imported)."""

import os

import torch

from dszero.quantize import QuantSpec, dequantize, dequantize_torch, quantize, quantize_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def main() -> None:
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 without a GPU"
    os.environ["DSZERO_QUANT_KERNELS"] = "triton"
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 301, generator=gen) * 10.0 ** torch.randint(-3, 4, (3, 301), generator=gen)
    x[0, 1] = x[0, 0] = 0.5 * 127 / 127  # equal values and halfway points round alike
    x[1, 64] = float("inf")
    x[2, 5] = float("nan")
    checked = 0
    for spec in (QuantSpec(8, 64), QuantSpec(8, 64, False), QuantSpec(4, 64), QuantSpec(4, 64, False),
                 QuantSpec(4, 8)):
        for rows in (x, x.to(torch.bfloat16), x[:, :17]):
            expected = quantize_torch(rows, spec)
            got = quantize(rows.to(DEVICE), spec).cpu()
            assert torch.equal(got, expected), (spec, rows.dtype, rows.shape)
            numel = rows.shape[1]
            for dtype in (torch.float32, torch.float16):
                values = dequantize(expected.to(DEVICE), numel, spec, dtype=dtype).cpu()
                want = dequantize_torch(expected, numel, spec).to(dtype)
                assert torch.equal(values.isnan(), want.isnan()), (spec, dtype)
                assert torch.equal(values.nan_to_num(), want.nan_to_num()), (spec, dtype)
            checked += 1
    print(f"triton payloads equal the torch path's in {checked} cases on {DEVICE}")


if __name__ == "__main__":
    main()
