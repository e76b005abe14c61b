"""AutoEP's expert MLP (SwiGLU, fused gate/up) forward + backward at Mixtral 8x7B's shape (hidden 4096,
intermediate 14336, 8 experts, 4096 tokens routed top-2 by random logits) in bf16: torch._grouped_mm and the
Triton grouped GEMM against the per-expert loop (one cuBLAS matmul per expert). Target: each >= 2x the
loop's speed (the ratio is the loop's time over the backend's).

    python tools/gpu_check/benches/bench_grouped_gemm.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device, figure, interleaved, median, parse, skipped, write

from dsmoe.autoep import expert_mlp


def main() -> None:
    args = parse(__doc__)
    tokens, hidden, ffn, experts, rounds, iters = (64, 64, 96, 8, 2, 1) if args.smoke else (4096, 4096, 14336, 8, 5, 3)
    dev, dtype = device(), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    chosen = torch.randn(tokens, experts, generator=gen).topk(2, dim=-1).indices.flatten()
    sizes = torch.bincount(chosen, minlength=experts).tolist()
    rows = sum(sizes)
    x = (torch.randn(rows, hidden, generator=gen) * 0.5).to(dev, dtype).requires_grad_()
    w1 = (torch.randn(experts, 2 * ffn, hidden, generator=gen) * 0.02).to(dev, dtype).requires_grad_()
    w2 = (torch.randn(experts, hidden, ffn, generator=gen) * 0.02).to(dev, dtype).requires_grad_()
    grad = torch.randn(rows, hidden, generator=gen).to(dev, dtype)

    def step(backend: str):
        def run() -> None:
            expert_mlp(x, sizes, w1, w2, None, False, F.silu, backend).backward(grad)
        return run

    backends = ["loop", "grouped_mm"]
    if dev.type == "cuda" and importlib.util.find_spec("triton") is not None:
        backends.append("triton")
    times = interleaved({b: step(b) for b in backends}, rounds, iters, warmup=2)
    loop = median(times["loop"]) * 1e3
    shape = f"{tokens} tokens top-2 -> rows per expert {sizes}, hidden {hidden}, intermediate {ffn}"
    per_round = {k: [round(t * 1e3, 3) for t in v] for k, v in times.items()}
    figures = []
    for backend in ("grouped_mm", "triton"):
        name = f"AutoEP expert MLP fwd+bwd, Mixtral shape, bf16: {backend} speed-up over the loop"
        if backend not in times:
            figures.append(skipped(name, "the Triton kernel needs CUDA and triton", "x", "per-expert loop", ">= 2"))
            continue
        ms = median(times[backend]) * 1e3
        # the figure is a speed: the loop's time over ours, so >= 2 means twice as fast
        figures.append(figure(name, loop / ms, "x", "per-expert loop (1x)", 1.0, ">= 2", rounds,
                              ms=ms, loop_ms=loop, shape=shape, per_round_ms=per_round))
    write(args, figures)


if __name__ == "__main__":
    main()
