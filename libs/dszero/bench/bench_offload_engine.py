"""ZeRO-2 with CPU optimizer offload measured through the engine users run (dstrain.initialize), beside DDP.

bench_stages.py drives dszero.ZeroOptimizer directly and hands it a CPUAdam; this script goes the way a
user's script goes: a config with an `optimizer` section and `offload_optimizer`, built by
dstrain.initialize(), stepped with engine.backward / engine.step. The GPT is bench_stages.py's (27M
parameters, fp32, 2 gloo ranks); each configuration runs in freshly forked ranks, alternated with DDP +
torch.optim.AdamW(foreach=True) in the same round, and the median step time's ratio is printed.

    python libs/dszero/bench/bench_offload_engine.py [--steps 8] [--rounds 2] [--kinds engine_zero2,...]

Kinds: engine_zero2 (no offload), engine_offload_zero2 (the config's AdamW under offload: CPUAdam),
engine_offload_zero2_torch_adam (the same with "torch_adam": true: torch's AdamW on the CPU copy, what the
engine ran before it selected CPUAdam). Beside each step time, the median time of engine.step() alone
(what remains of the gradient reduction, the norm, the optimizer update and the parameters' all-gather).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from bench_stages import GPT, MICRO, SEQ, VOCAB, run  # the sibling script: its model and DDP run

from dscomm.testing import run_ranks


def engine_run(rank: int, world: int, kind: str, steps: int) -> dict:
    import dstrain

    torch.manual_seed(0)
    model = GPT()
    zero = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5_000_000}
    params = {"lr": 1e-4, "weight_decay": 0.01}
    if "offload" in kind:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if kind.endswith("torch_adam"):
        params["torch_adam"] = True
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
              "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": params}}
    engine, *_ = dstrain.initialize(model=model, config=config)
    gen = torch.Generator().manual_seed(rank)
    times, updates = [], []
    for i in range(steps + 2):  # two warm-up steps
        tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
        torch.distributed.barrier()
        began = time.perf_counter()
        loss = nn.functional.cross_entropy(engine(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        engine.backward(loss)
        update_began = time.perf_counter()
        engine.step()  # the rest of the reduction, the norm, the optimizer update and the parameters' all-gather
        if i >= 2:
            times.append(time.perf_counter() - began)
            updates.append(time.perf_counter() - update_began)
    return {"step_s": statistics.median(times), "update_s": statistics.median(updates),
            "optimizer": type(engine.basic_optimizer).__name__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="engine_zero2,engine_offload_zero2,engine_offload_zero2_torch_adam")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    steps: dict[str, list[float]] = {k: [] for k in ["ddp", *kinds]}
    updates: dict[str, list[float]] = {k: [] for k in kinds}
    optimizers: dict[str, str] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            anchor = max(run_ranks(run, 2, "ddp", args.steps, timeout=3600), key=lambda r: r["step_s"])
            other = max(run_ranks(engine_run, 2, kind, args.steps, timeout=3600), key=lambda r: r["step_s"])
            steps["ddp"].append(anchor["step_s"])
            steps[kind].append(other["step_s"])
            updates[kind].append(other["update_s"])
            optimizers[kind] = other["optimizer"]
            ratios[kind].append(other["step_s"] / anchor["step_s"])
    print(f"GPT {sum(p.numel() for p in GPT().parameters()) / 1e6:.1f}M parameters, 2 gloo ranks, fp32, micro-batch "
          f"{MICRO} x {SEQ}; {args.steps} timed steps, {args.rounds} round(s); through dstrain.initialize; "
          f"ratio = config / DDP in the same round")
    print(f"{'config':<34}{'optimizer':>10}{'step (s)':>10}{'engine.step() (s)':>19}{'x DDP':>7}   x DDP by round")
    print(f"{'ddp':<34}{'AdamW':>10}{statistics.median(steps['ddp']):>10.3f}{'':>19}{'1.00':>7}")
    for kind in kinds:
        by_round = ", ".join(f"{r:.2f}" for r in ratios[kind])
        print(f"{kind:<34}{optimizers[kind]:>10}{statistics.median(steps[kind]):>10.3f}"
              f"{statistics.median(updates[kind]):>19.3f}{statistics.median(ratios[kind]):>7.2f}   {by_round}")


if __name__ == "__main__":
    main()
