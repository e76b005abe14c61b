"""The flops profiler's overhead on a forward pass, side by side with the bare forward and with
torch's FlopCounterMode alone (the counting the profiler builds on).

    flock /tmp/dstrain-bench.lock python libs/dsmonitor/bench/bench_profiler.py
"""

import statistics
import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dsmonitor import FlopsProfiler

REPEATS = 30


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def timed(fn):
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def run_case(name, layers, dim, batch, seq):
    model = nn.Sequential(*[Block(dim, 4) for _ in range(layers)]).eval()
    x = torch.randn(batch, seq, dim)
    prof = FlopsProfiler(model)

    def counted():
        with FlopCounterMode(display=False):
            model(x)

    def profiled():
        prof.start_profile()
        model(x)
        prof.stop_profile()

    with torch.no_grad():
        model(x)  # warm-up
        profiled()  # the first profiled pass pays one-off dispatch setup
        bare = timed(lambda: model(x))
        counter = timed(counted)
        profiler = timed(profiled)
    gflops = prof.get_total_flops() / 1e9
    print(f"{name}: {gflops:.2f} GFLOP per forward, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params")
    print(f"  {'forward pass':36s} {'median ms':>10s} {'vs bare':>8s}")
    for label, ms in (("bare", bare), ("torch FlopCounterMode alone", counter), ("dsmonitor FlopsProfiler", profiler)):
        print(f"  {label:36s} {ms:10.2f} {ms / bare:7.2f}x")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the shared machine has 2 cores; keep the comparison stable
    run_case("small (4 x d=128, 8x64 tokens)", 4, 128, 8, 64)
    run_case("larger (8 x d=256, 8x128 tokens)", 8, 256, 8, 128)


if __name__ == "__main__":
    main()
