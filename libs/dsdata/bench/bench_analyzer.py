"""DataAnalyzer throughput on a synthetic tokenized dataset, at 1 and 2 map processes.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsdata/bench/bench_analyzer.py --samples 1000000

The dataset is `samples` windows of `seq` token ids (int32, in memory) fetched one sample at a time
and collated by torch's default collate, as a Megatron-style dataset is (`--batched` fetches a batch
at once through __getitems__ instead); two metrics, as DeepSpeed's GPT examples analyze: the sequence
length (non-padding tokens) and a vocabulary rarity (summed -log frequency, as an integer). Prints the
map and reduce times and the samples per second of each process count, and checks that the files are
identical.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch

from dsdata import DataAnalyzer


class Windows(torch.utils.data.Dataset):
    def __init__(self, samples: int, seq: int, vocab: int):
        gen = torch.Generator().manual_seed(0)
        # Zipf-like token ids, so the rarity metric has a spread of values; padding (0) at the tail of each window.
        ranks = torch.randint(1, vocab, (samples, seq), generator=gen, dtype=torch.int32)
        self.tokens = (ranks.float().pow(2) / vocab).clamp(min=1).to(torch.int32)
        lengths = torch.randint(seq // 4, seq + 1, (samples,), generator=gen)
        self.tokens[torch.arange(seq) >= lengths[:, None]] = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]



class BatchedWindows(Windows):
    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.tokens[torch.as_tensor(indices)]


def seqlen(batch: torch.Tensor) -> torch.Tensor:
    return (batch != 0).sum(dim=1).to(torch.int64)


class Rarity:
    def __init__(self, dataset: Windows, vocab: int):
        counts = torch.bincount(dataset.tokens.reshape(-1).long(), minlength=vocab).double() + 1
        self.cost = (-(counts / counts.sum()).log() * 10).round().to(torch.int64)
        self.cost[0] = 0

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        return self.cost[batch.long()].sum(dim=1)


def _spin() -> None:
    total = 0
    for i in range(3_000_000):
        total += i * i


def machine_ceiling() -> float:
    """How much faster 2 processes do twice a trivially parallel loop's work than 1 does it once, right now:
    the most any 2-process speedup can reach on this (shared) machine at this moment."""
    start = time.perf_counter()
    _spin()
    one = time.perf_counter() - start
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _spin()
        os._exit(0)
    _spin()
    os.waitpid(pid, 0)
    return 2 * one / (time.perf_counter() - start)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(dataset: Windows, rarity: Rarity, processes: int, batch_size: int, out: Path) -> tuple[float, float, float]:
    """(map seconds, reduce seconds, map CPU seconds of all processes)."""
    batched = isinstance(dataset, BatchedWindows)
    analyzer = DataAnalyzer(dataset, num_threads=processes, batch_size=batch_size, metric_names=["seqlen", "rarity"],
                            metric_functions=[seqlen, rarity], metric_types=["single_value_per_sample"] * 2,
                            metric_dtypes=[torch.int64, torch.int64], save_path=str(out),
                            collate_fn=(lambda batch: batch) if batched else None)
    cpu, start = _cpu_seconds(), time.perf_counter()
    analyzer.run_map()
    mapped, map_cpu = time.perf_counter(), _cpu_seconds() - cpu
    analyzer.run_reduce()
    return mapped - start, time.perf_counter() - mapped, map_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs of each process count")
    parser.add_argument("--batched", action="store_true", help="fetch whole batches (__getitems__)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    dataset = (BatchedWindows if args.batched else Windows)(args.samples, args.seq, args.vocab)
    rarity = Rarity(dataset, args.vocab)
    root = Path(tempfile.mkdtemp(prefix="dsdata-bench-"))
    try:
        times: dict[int, list[tuple[float, float, float]]] = {1: [], 2: []}
        ceilings = []
        for _ in range(args.repeats):  # alternating, so both see the same load drift
            ceilings.append(machine_ceiling())
            for processes in (1, 2):
                out = root / f"p{processes}"
                shutil.rmtree(out, ignore_errors=True)
                times[processes].append(run(dataset, rarity, processes, args.batch_size, out))
        best = {p: min(runs) for p, runs in times.items()}
        median = {p: sorted(runs)[len(runs) // 2] for p, runs in times.items()}
        for processes in (1, 2):
            (map_s, reduce_s, cpu), mid_map = best[processes], median[processes][0]
            print(f"{processes} process(es): map best {map_s:.2f} s ({args.samples / map_s:,.0f} samples/s), median "
                  f"{mid_map:.2f} s; reduce {reduce_s:.2f} s; map CPU {cpu:.2f} s = {cpu / map_s / processes:.0%} of "
                  f"{processes} core(s) while it ran")
        print(f"a trivially parallel loop at 2 processes, measured beside each run: best {max(ceilings):.2f}x, "
              f"median {sorted(ceilings)[len(ceilings) // 2]:.2f}x (the machine's ceiling now)")
        print(f"map speedup at 2 processes: best {best[1][0] / best[2][0]:.2f}x, median "
              f"{median[1][0] / median[2][0]:.2f}x; end to end (best): {(best[1][0] + best[1][1]) / (best[2][0] + best[2][1]):.2f}x")
        same = all(filecmp.cmp(a, root / "p2" / a.relative_to(root / "p1"), shallow=False)
                   for a in (root / "p1").glob("*/*_index_*.*"))
        print(f"merged files identical for 1 and 2 processes: {same}")
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
