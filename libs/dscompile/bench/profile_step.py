"""Where one steady-state step of compiled ZeRO-3 (or eager ZeRO-3) goes, on the bench's 27M GPT, 2 gloo ranks:
torch.profiler over one step after warm-up, top ops by self CPU time, plus the runtime's gather-wait seconds.

    python libs/dscompile/bench/profile_step.py [--kind compiled_zero3|zero3|zero1] [--backend inductor] [--settings JSON]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from bench_deepcompile import GPT, MICRO, SEQ, VOCAB, WARMUP_STEPS
from torch import nn

import dscompile
import dszero
from dscomm.testing import run_ranks
from dsconfig import CompileConfig, ZeroConfig


def run(rank: int, world: int, kind: str, backend: str, settings: dict) -> dict:
    torch.manual_seed(0)
    model = GPT()
    cfg = ZeroConfig(stage=1 if kind == "zero1" else 3, stage3_param_persistence_threshold=100_000, stage3_prefetch_bucket_size=5_000_000)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True), cfg)
    runtime = dscompile.deepcompile(model, zero, CompileConfig(deepcompile=True, **settings), backend=backend) \
        if kind == "compiled_zero3" else None
    gen = torch.Generator().manual_seed(rank)
    times = {}

    def step(tokens):
        began = time.perf_counter()
        loss = nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        forward = time.perf_counter()
        zero.backward(loss)
        backward = time.perf_counter()
        zero.step()
        zero.zero_grad()
        times.update(forward=forward - began, backward=backward - forward, step=time.perf_counter() - backward)

    for _ in range(WARMUP_STEPS if runtime is not None else 2):
        step(torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen))
    waits = runtime.stats.get("gather_wait_us", 0) if runtime is not None else 0
    torch.distributed.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen))
    out = {"times": dict(times), "table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22)}
    if runtime is not None:
        out["gather_wait_s"] = (runtime.stats.get("gather_wait_us", 0) - waits) / 1e6
        out["stats"] = dict(runtime.stats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="compiled_zero3")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--settings", default="{}", help="compile section keys, JSON (e.g. the sync_* switches)")
    args = parser.parse_args()
    results = run_ranks(run, 2, args.kind, args.backend, json.loads(args.settings), timeout=3600)
    for rank, result in enumerate(results):
        print(f"rank {rank}: {result['times']} gather wait {result.get('gather_wait_s')} s {result.get('stats')}")
    print(results[0]["table"])


if __name__ == "__main__":
    main()
