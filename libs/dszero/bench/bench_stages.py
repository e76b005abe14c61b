"""Step time and per-rank memory of ZeRO stages 0-3 (and CPU optimizer offload) beside torch DDP.

A GPT-style model of about 27M parameters (vocab 8192, d 512, 6 layers, seq 128, micro-batch 4),
fp32, 2 gloo ranks on the CPU. Every configuration runs in its own freshly forked pair of ranks,
alternating with DDP in each round (DDP, config, DDP, config, ...), and the median step time of each
is printed with the median over rounds of its ratio to the DDP run of its round.

    python libs/dszero/bench/bench_stages.py [--steps 8] [--rounds 2] [--kinds zero0,zero1,zero2,zero3,...]
        [--baseline-src OTHER/libs/dszero/src]

Kinds: zero0-zero3, offload_zero2 / offload_zero3 (CPU optimizer offload with CPUAdam),
zero3_noprefetch (stage 3 with stage3_prefetch_bucket_size 0: every unit gathered on demand) and
fsdp2 (torch's fully_shard per block and on the root). --baseline-src runs every ZeRO kind a second
time in the same round, right after the first, with dszero imported from that source tree (another
checkout's, e.g. `git archive main libs/dszero/src`), so before and after share their DDP anchor.
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dscomm.testing import run_ranks
from dsconfig import OffloadOptimizerConfig, ZeroConfig

VOCAB, D, LAYERS, SEQ, MICRO = 8192, 512, 6, 128, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 8, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.norm1(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.zeros(SEQ, D))
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.pos)))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


BASELINE = "@base"  # suffix of a kind run with dszero from --baseline-src


def import_dszero(source: str | None):
    """dszero, from `source` when given (in a forked rank: the parent's copy is dropped first)."""
    if source:
        for name in [n for n in sys.modules if n == "dszero" or n.startswith("dszero.")]:
            del sys.modules[name]
        sys.path.insert(0, source)
    return importlib.import_module("dszero")


def run(rank: int, world: int, kind: str, steps: int, baseline_src: str | None = None) -> dict:
    dszero = import_dszero(baseline_src if kind.endswith(BASELINE) else None)
    kind = kind.removesuffix(BASELINE)
    torch.manual_seed(0)
    model = GPT()
    start_rss = rss_mb()
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step(tokens):
            loss = nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    elif kind == "ddp":
        trainer = DDP(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step(tokens):
            loss = nn.functional.cross_entropy(trainer(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    else:
        stage = int(kind.split("_")[0][-1]) if kind.startswith("zero") else int(kind[-1])
        offload = "offload" in kind
        # About one and a half blocks ahead (FSDP2 prefetches one block); zero3_noprefetch gathers on demand.
        prefetch = 0 if kind.endswith("noprefetch") else 5_000_000
        if offload:
            optimizer = importlib.import_module("dszero.ops").CPUAdam(model.parameters(), lr=1e-4)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        cfg = ZeroConfig(stage=stage, overlap_comm=stage == 2, reduce_bucket_size=5_000_000,
                         stage3_param_persistence_threshold=100_000, stage3_prefetch_bucket_size=prefetch,
                         offload_optimizer=OffloadOptimizerConfig(device="cpu", pin_memory=False) if offload else None)
        zero = dszero.ZeroOptimizer(model, optimizer, cfg)

        def step(tokens):
            loss = nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            zero.backward(loss)
            zero.step()
            zero.zero_grad()
    gen = torch.Generator().manual_seed(rank)
    times, cpu = [], []
    for i in range(steps + 2):  # two warm-up steps
        tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
        torch.distributed.barrier()
        began, cpu_began = time.perf_counter(), time.process_time()
        step(tokens)
        if i >= 2:
            times.append(time.perf_counter() - began)
            cpu.append(time.process_time() - cpu_began)  # this rank's CPU time, its comm threads included
    states = zero.memory_report() if kind not in ("ddp", "fsdp2") else None
    return {"step_s": statistics.median(times), "cpu_s": statistics.median(cpu), "peak_rss_mb": rss_mb(), "rss_growth_mb": rss_mb() - start_rss,
            "params": sum(p.numel() for p in model.parameters()), "model_states": states}


def one_run(kind: str, steps: int, baseline_src: str | None) -> dict:
    """One configuration in freshly forked ranks: the slowest rank's step time, the ranks' mean CPU time."""
    results = run_ranks(run, 2, kind, steps, baseline_src, timeout=3600)
    slowest = dict(max(results, key=lambda r: r["step_s"]))
    slowest["cpu_s"] = statistics.fmean(r["cpu_s"] for r in results)
    return slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="zero0,zero1,zero2,offload_zero2",
                        help="comma-separated: zero0..zero3, offload_zero2, offload_zero3, zero3_noprefetch, fsdp2")
    parser.add_argument("--baseline-src", default=None,
                        help="also run each ZeRO kind with dszero imported from this src folder (before/after)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if args.baseline_src:
        kinds = [k for kind in kinds for k in ([kind + BASELINE, kind] if kind.startswith(("zero", "offload"))
                                                else [kind])]
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    cpu_ratios: dict[str, list[float]] = {k: [] for k in kinds}
    rows: dict[str, list[dict]] = {k: [] for k in ["ddp", *kinds]}
    loads: list[float] = []
    for _ in range(args.rounds):
        anchor = None
        for kind in kinds:
            if anchor is None:
                anchor = one_run("ddp", args.steps, None)
                rows["ddp"].append(anchor)
            other = one_run(kind, args.steps, args.baseline_src)
            rows[kind].append(other)
            ratios[kind].append(other["step_s"] / anchor["step_s"])
            cpu_ratios[kind].append(other["cpu_s"] / anchor["cpu_s"])
            loads.append(os.getloadavg()[0])
            print(f"round {len(rows[kind])}: {kind} {other['step_s']:.3f} s (CPU {other['cpu_s']:.3f}), DDP "
                  f"{anchor['step_s']:.3f} s (CPU {anchor['cpu_s']:.3f}), load {loads[-1]:.1f}",
                  file=sys.stderr, flush=True)
            if not kind.endswith(BASELINE):
                anchor = None  # a kind and its baseline, run just before it, share one DDP run
    params = next(r for r in rows.values() if r)[0]["params"]
    print(f"GPT {params / 1e6:.1f}M parameters, 2 gloo ranks, fp32, micro-batch {MICRO} x {SEQ}; "
          f"{args.steps} timed steps, {args.rounds} round(s); ratio = config / DDP in the same round "
          f"(median over rounds, then each round's)")
    if args.baseline_src:
        print(f"{BASELINE}: dszero from {args.baseline_src}")
    print(f"1-minute load average after each run: {min(loads):.1f}-{max(loads):.1f} (median "
          f"{statistics.median(loads):.1f}); CPU = a rank's CPU time per step, comm threads included (mean of ranks)")
    print(f"{'config':<22}{'step (s)':>10}{'x DDP':>8}  {'by round':<24}{'CPU x DDP':>10}{'peak RSS/rank (MB)':>20}"
          f"{'model states/rank (MB)':>24}")
    for kind in [k for k in rows if rows[k]]:
        step = statistics.median(r["step_s"] for r in rows[kind])
        ratio = f"{statistics.median(ratios[kind]):.3f}" if kind in ratios else "1.000"
        cpu_ratio = f"{statistics.median(cpu_ratios[kind]):.3f}" if kind in cpu_ratios else "1.000"
        by_round = ", ".join(f"{r:.2f}" for r in ratios.get(kind, []))
        states = rows[kind][0]["model_states"]
        if states:
            state_mb = f"{(states['total'] - states['communication_buffers']) / 2**20:.0f}"
        else:  # DDP holds 16 B per parameter; FSDP2 shards all of it
            state_mb = f"{16 * params / 2**20 / (2 if kind == 'fsdp2' else 1):.0f} (formula)"
        peak = statistics.median(r["peak_rss_mb"] for r in rows[kind])
        print(f"{kind:<22}{step:>10.3f}{ratio:>8}  {by_round:<24}{cpu_ratio:>10}{peak:>20.0f}{state_mb:>24}")
    for kind in [k for k in kinds if k + BASELINE in rows]:
        paired = [r / b for r, b in zip(ratios[kind], ratios[kind + BASELINE])]  # same DDP run: step over step
        print(f"{kind} / {kind}{BASELINE}: {statistics.median(paired):.3f} (by round "
              f"{', '.join(f'{p:.3f}' for p in paired)})")


if __name__ == "__main__":
    main()
