"""CPUAdam against torch.optim.AdamW (foreach and fused) on CPU, side by side in one run.

    flock /tmp/dstrain-bench.lock python libs/dszero/bench/bench_cpu_adam.py

Each optimizer owns a copy of the same parameters (a few fp32 tensors totalling ~27M and ~100M
elements, the sizes of the issue's GPT and of a larger offloaded shard) with fixed gradients. The
optimizers take turns, one timed step each per round, so drift in the machine's load hits all of
them alike; the median of the rounds is reported, with the median over rounds of each one's time
divided by CPUAdam's in the same round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dszero.ops import CPUAdam, native_available

# ~27M: the GPT (vocab 8192, d 512, 6 layers) as embedding, head, attention, MLP and a
# small odd-sized tensor standing in for norms and biases; ~100M: four 25M shards.
SIZES = {
    "27M": [8192 * 512, 8192 * 512, 6 * 4 * 512 * 512, 6 * 2 * 512 * 2048, 6 * 13 * 512 + 1],
    "100M": [25_000_000] * 4,
}


def make_optimizers(numels: list[int]) -> dict[str, torch.optim.Optimizer]:
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(n, generator=gen) for n in numels]
    grads = [torch.randn(n, generator=gen) * 1e-2 for n in numels]
    kinds = {
        "CPUAdam": lambda ps: CPUAdam(ps, lr=1e-4, weight_decay=0.01),
        "AdamW(foreach)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, foreach=True),
        "AdamW(fused)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, fused=True),
    }
    optimizers = {}
    for name, build in kinds.items():
        params = [torch.nn.Parameter(b.clone()) for b in base]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizers[name] = build(params)
    return optimizers


def run(label: str, numels: list[int], rounds: int, warmup: int) -> None:
    optimizers = make_optimizers(numels)
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for i in range(warmup + rounds):
        for name, opt in optimizers.items():
            start = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[name].append(elapsed)
    medians = {name: statistics.median(t) for name, t in times.items()}
    # Paired: each round's ratio to CPUAdam's step of the same round, so load that comes and goes
    # on the shared cores cancels out of the ratio.
    paired = {name: statistics.median(a / b for a, b in zip(t, times["CPUAdam"])) for name, t in times.items()}
    print(f"{label}: {sum(numels) / 1e6:.1f}M fp32 params in {len(numels)} tensors, "
          f"{torch.get_num_threads()} threads, median of {rounds} steps")
    for name, median in medians.items():
        gbps = sum(numels) * 28 / median / 1e9  # read p, g, m, v; write p, m, v
        print(f"  {name:<16} {median * 1e3:8.2f} ms   {gbps:5.1f} GB/s   {paired[name]:5.2f}x CPUAdam (paired)")
    del optimizers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if not native_available():
        print("warning: dszero's native kernel is not built; CPUAdam runs its torch fallback")
    print(f"torch {torch.__version__}, CPUAdam native={native_available()}")
    for label in args.sizes:
        run(label, SIZES[label], args.rounds, args.warmup)


if __name__ == "__main__":
    main()
