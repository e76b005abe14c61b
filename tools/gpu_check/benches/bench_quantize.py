"""ZeRO++'s quantizers (int8, symmetric, blocks of 256: the weights' default) on 256 Mi bf16 elements, in GB/s
of memory moved (input read plus output written), against the device's own bandwidth measured in the same run
by a device-to-device copy of the same bytes (read plus written). Target: each >= 50% of the copy's rate.

    python tools/gpu_check/benches/bench_quantize.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device, figure, interleaved, median, parse, write

from dszero.quantize import QuantSpec, backend, dequantize, quantize


def main() -> None:
    args = parse(__doc__)
    numel, rounds, iters = ((1 << 20) + 5, 2, 1) if args.smoke else (256 << 20, 7, 5)
    dev, spec = device(), QuantSpec(8, 256)
    x = torch.randn(numel, device=dev, dtype=torch.bfloat16)
    payload = quantize(x, spec)
    out = torch.empty(1, numel, device=dev, dtype=torch.bfloat16)
    copy_src = torch.empty(x.numel() * x.element_size(), dtype=torch.uint8, device=dev)
    copy_dst = torch.empty_like(copy_src)
    times = interleaved({
        "copy": lambda: copy_dst.copy_(copy_src),
        "quantize": lambda: quantize(x, spec),
        "dequantize": lambda: dequantize(payload, numel, spec, out=out),
    }, rounds, iters)
    x_bytes, payload_bytes = x.numel() * x.element_size(), payload.numel()
    rate = {name: moved / median(times[name]) / 1e9 for name, moved in (
        ("copy", 2 * copy_src.numel()), ("quantize", x_bytes + payload_bytes), ("dequantize", payload_bytes + x_bytes))}
    common = {"kernels": backend(x), "elements": numel, "payload_bytes": payload_bytes,
              "per_round_ms": {k: [round(t * 1e3, 4) for t in v] for k, v in times.items()}}
    write(args, [figure(f"ZeRO++ {step}, int8 blocks of 256, bf16 values", rate[step], "GB/s",
                        "device-to-device copy", rate["copy"], ">= 0.5", rounds, **common)
                 for step in ("quantize", "dequantize")])


if __name__ == "__main__":
    main()
