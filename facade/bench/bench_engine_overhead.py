"""Per-step cost of the dstrain engine over a hand-written torch loop on the same model.

World size 1, ZeRO stage 0, fp32, the main example's GPT. Both loops run in this one process,
interleaved in rounds (engine, plain, plain-foreach, ...), and each round's median step time is
taken; the ratios of those medians are printed. Also times `import dstrain` (the package), the
engine's import, and `import torch`, each in fresh interpreters.

    flock /tmp/dstrain-bench.lock python facade/bench/bench_engine_overhead.py --rounds 5 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt_model import GPT

import dstrain


def batches(count: int, micro: int, seq: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (micro, seq + 1), generator=gen) for _ in range(count)]


def time_steps(step, data) -> list[float]:
    times = []
    for batch in data:
        start = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - start)
    return times


def plain_loop(foreach: bool | None, size: dict):
    torch.manual_seed(0)
    model = GPT(**size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)

    def step(batch):
        loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def engine_loop(micro: int, size: dict):
    torch.manual_seed(0)
    model = GPT(**size)
    engine, *_ = dstrain.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 0.0, "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})

    def step(batch):
        engine.backward(engine(batch))
        engine.step()

    return step


def import_seconds(statement: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", f"import time; t = time.perf_counter(); {statement}; "
                              f"print(time.perf_counter() - t)"], capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=128, help="128 / 4 layers: the main example's GPT")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--import-runs", type=int, default=7, help="0 skips the import timings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    size = {"seq": args.seq, "d_model": args.d_model, "layers": args.layers}
    loops = {"engine": engine_loop(args.micro, size), "plain": plain_loop(None, size),
             "plain_foreach": plain_loop(True, size)}
    data = batches(args.steps, args.micro, args.seq)
    for step in loops.values():  # warm-up
        time_steps(step, data[:3])
    medians: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, step in loops.items():
            medians[name].append(statistics.median(time_steps(step, data)))
    result = {name: statistics.median(values) for name, values in medians.items()}
    print(f"step time, median of {args.rounds} rounds x {args.steps} steps (d_model {args.d_model}, {args.layers} "
          f"layers, micro {args.micro}, seq {args.seq}, {args.threads} thread(s)):")
    for name, seconds in result.items():
        print(f"  {name:14s} {seconds * 1e3:8.2f} ms   engine / this = {result['engine'] / seconds:.3f}")
    print("per-round ratio engine/plain:", [f"{e / p:.3f}" for e, p in zip(medians["engine"], medians["plain"])])
    print(f"engine - plain = {(result['engine'] - result['plain']) * 1e6:+.0f} us per step")
    if not args.import_runs:
        return
    torch_s = import_seconds("import torch", args.import_runs)
    package_s = import_seconds("import dstrain", args.import_runs)
    engine_s = import_seconds("import dstrain; dstrain.initialize", args.import_runs)
    print(f"import torch {torch_s * 1e3:.0f} ms; import dstrain {package_s * 1e3:.0f} ms; import dstrain + "
          f"engine (torch included) {engine_s * 1e3:.0f} ms = {engine_s / torch_s:.2f}x import torch "
          f"(medians of {args.import_runs} fresh interpreters)")


if __name__ == "__main__":
    main()
