"""Whether stage 3's per-unit gradient reductions would be faster as fewer, larger calls on gloo.

The bench GPT's gradients (27.4M fp32: the units of bench_stages.GPT, padded as dszero lays them out), reduced
between 2 gloo ranks as dszero's stage 3 does on gloo (one `reduce` per rank's shard of each unit, all launched
asynchronously, then waited for), against the same bytes cut into 4 and into 1 bucket, in one run, medians of
several repeats:

    flock /tmp/dstrain-bench.lock python libs/dszero/bench/bench_reduce_calls.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from dscomm.testing import run_ranks

# The non-persistent units of the bench GPT (embedding, 6 blocks of attention / two MLP layers, head) and the
# persistent ones (13 layer norms, the position table), in elements.
UNIT_NUMELS = [4194304] + [1050624, 1050624, 1049088] * 6 + [4194304] + [1024] * 13 + [65536]


def _reduce_halves(flat: torch.Tensor) -> list:
    half = flat.numel() // 2
    return [dist.reduce(flat[r * half:(r + 1) * half], r, async_op=True) for r in range(2)]


def run(rank: int, world: int, repeats: int) -> dict[str, float]:
    torch.set_num_threads(1)
    units = [torch.randn(n) for n in UNIT_NUMELS]
    whole = torch.randn(sum(UNIT_NUMELS))

    def per_unit():
        for handle in [h for flat in units for h in _reduce_halves(flat)]:
            handle.wait()

    def buckets(count: int):
        for handle in [h for part in whole.chunk(count) for h in _reduce_halves(part)]:
            handle.wait()

    cases = {"per unit (dszero)": per_unit, "4 buckets": lambda: buckets(4), "1 bucket": lambda: buckets(1)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():  # interleaved, so the machine's load falls on every case alike
            dist.barrier()
            began = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    results = run_ranks(run, 2, args.repeats, timeout=600)
    slower = {name: max(r[name] for r in results) for name in results[0]}
    anchor = slower["per unit (dszero)"]
    print(f"{sum(UNIT_NUMELS) / 1e6:.1f}M fp32 gradients, 2 gloo ranks, {args.repeats} repeats (median, slower rank)")
    for name, ms in slower.items():
        print(f"{name:<20}{ms:>9.1f} ms{ms / anchor:>8.2f}x")


if __name__ == "__main__":
    main()
