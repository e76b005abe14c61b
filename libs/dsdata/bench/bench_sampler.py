"""The curriculum sampler's cost per micro-batch, against a plain DistributedSampler and against a training
step of the example GPT (facade/examples/train_gpt_data_efficiency.py's model and sizes).

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsdata/bench/bench_sampler.py

Index files for 1M samples (a length metric 1..128) come from the DataAnalyzer; the sampler's schedule
rises from 16 to 128 over the measured steps, so clusters open (and are reshuffled) while it is timed.
What is timed is drawing each micro-batch's sample indices as the loader does, including the state
recorded with every batch for exact resume; the data fetch itself is the same for both samplers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, DistributedSampler

from dsdata import DataAnalyzer, DataSampler
from dsdata.sampled_loader import _Recorded


class Lengths(torch.utils.data.Dataset):
    def __init__(self, samples: int):
        self.lengths = torch.randint(1, 129, (samples,), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.lengths[index]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.lengths[torch.as_tensor(indices)]


def sampler_config(index: Path, steps: int) -> dict:
    metric = {"index_to_sample_path": str(index / "length" / "length_index_to_sample"),
              "index_to_metric_path": str(index / "length" / "length_index_to_metric"), "difficulty_type": "value",
              "clustering_type": "schedule_based", "min_difficulty": 16, "max_difficulty": 128,
              "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": steps,
                                                                   "difficulty_step": 8}}
    return {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "data_cluster_path": str(index / "clusters"), "curriculum_metrics": {"length": metric}}}}


def per_batch_us(batches, count: int) -> tuple[float, float]:
    """(mean, max) microseconds per batch over `count` batches."""
    times = []
    iterator = iter(batches)
    for _ in range(count):
        start = time.perf_counter()
        next(iterator)
        times.append(time.perf_counter() - start)
    return statistics.mean(times) * 1e6, max(times) * 1e6


def gpt_step_ms(micro: int, seq: int, steps: int) -> float:
    """Median forward + backward + AdamW step of the example GPT (plain torch: the engine only adds to it)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "facade" / "examples"))
    from gpt_model import GPT

    torch.manual_seed(0)
    model = GPT(seq=seq, d_model=96, layers=4, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (micro, seq + 1))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--data-parallel", type=int, default=2, help="the sampler draws for this many ranks")
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    root = Path(tempfile.mkdtemp(prefix="dsdata-sampler-"))
    try:
        dataset = Lengths(args.samples)
        DataAnalyzer(dataset, batch_size=10_000, metric_names=["length"], metric_functions=[lambda b: b.long()],
                     metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64], save_path=str(root),
                     collate_fn=lambda b: b).run_map_reduce()
        steps = args.batches // 2  # the schedule reaches the maximum half-way through the measured batches
        curriculum = DataSampler(sampler_config(root, steps), args.samples, args.micro_batch, 0, args.data_parallel)
        ours, ours_max = per_batch_us(_Recorded(curriculum, []), args.batches)
        plain = BatchSampler(DistributedSampler(dataset, num_replicas=args.data_parallel, rank=0, seed=0),
                             args.micro_batch, drop_last=True)
        theirs, theirs_max = per_batch_us(plain, args.batches)
        step = gpt_step_ms(args.micro_batch, 64, 20)
        print(f"curriculum sampler: {ours:.0f} us per micro-batch (mean over {args.batches}, with the state recorded "
              f"for each; {len(curriculum.clusters)} clusters opened; slowest batch {ours_max / 1e3:.1f} ms)")
        print(f"DistributedSampler + BatchSampler: {theirs:.1f} us per micro-batch (slowest {theirs_max / 1e3:.1f} ms, "
              f"the epoch's permutation)")
        print(f"example GPT training step (micro {args.micro_batch}, seq 64, 4 layers, d 96): {step:.1f} ms; the "
              f"sampler costs {ours / 1e3 / step:.2%} of it")
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
