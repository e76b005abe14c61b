"""What the NaN/inf check at the gate costs: the work it adds (isfinite + all over the router's logits, and
reading that one flag, which the layer does where it already waits for the device) against the layer's
forward. (AutoEP's layer does the same reduction; its flag travels with the split sizes it reads anyway.)

    flock /tmp/dstrain-bench.lock python libs/dsmoe/bench/bench_gate_check.py --rounds 5

CPU, one torch thread: each figure is the median of `--rounds` blocks of 20 calls.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dsmoe import MoE


def _median_ms(fn, rounds: int, calls: int = 20) -> float:
    fn()
    blocks = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(blocks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for tokens, hidden, experts in ((512, 512, 4), (4096, 1024, 64)):
        expert = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        layer = MoE(hidden, expert, num_experts=experts, k=2, capacity_factor=1.25, min_capacity=0)
        x = torch.randn(tokens, hidden)
        logits = torch.randn(tokens, experts)
        with torch.no_grad():
            forward = _median_ms(lambda layer=layer, x=x: layer(x), args.rounds)
            check = _median_ms(lambda logits=logits: bool(torch.isfinite(logits).all()), args.rounds, calls=200)
        print(f"{tokens} tokens x {hidden} hidden, {experts} experts, top-2: forward {forward:.2f} ms, the check "
              f"{check * 1e3:.1f} us = {check / forward * 100:.3f}% of the forward")


if __name__ == "__main__":
    main()
