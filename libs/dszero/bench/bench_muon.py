"""Muon under ZeRO stages 0-3 (dszero's whole-tensor step) beside torch DDP + Muon, on the example GPT.

The model is dstrain's example GPT (facade/examples/gpt_model.py), its parameters split by DeepSpeed's
rule (dstrain.ops.muon_params: embeddings and the head on the Adam half), optimizer dstrain.ops.Muon
(ns_method gram). 2 gloo ranks on the CPU, fp32, one torch thread per rank. Every configuration runs
in its own freshly forked ranks, alternating with the DDP anchor (DDP, config, DDP, config, ...):
DDP all-reduces gradients in backward and every rank runs Muon on every matrix (one rank's view).

Printed per configuration: the median training step (forward, backward, step), the median of the
step alone (zero.step(), or DDP's optimizer.step()), each as a ratio to the anchor of its round, and
the optimizer-state bytes per rank (memory_report()'s optimizer_state; DDP: Muon's own state).

    flock /tmp/dstrain-bench.lock python libs/dszero/bench/bench_muon.py [--d-model 512 --layers 6 --heads 8]
        [--steps 8] [--rounds 3] [--kinds zero0,zero1,zero2,zero3]

Needs the facade (dstrain) installed: Muon is dstrain's optimizer; dszero supplies the step it runs on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "facade" / "examples"))
from gpt_model import GPT  # the example's model (facade/examples is not a package)

VOCAB, SEQ, MICRO = 256, 128, 4


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


def run(rank: int, world: int, kind: str, steps: int, d_model: int, layers: int, heads: int) -> dict:
    from dstrain.ops import Muon
    from dstrain.ops.muon_params import select_muon_parameters

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, seq=SEQ, d_model=d_model, layers=layers, heads=heads)
    select_muon_parameters(model)
    optimizer = Muon(model.parameters(), lr=0.02, momentum=0.95, adam_lr=3e-4, ns_method="gram")
    if kind == "ddp":
        trainer = DDP(model)

        def backward(tokens):
            trainer(tokens).backward()

        def update():
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    else:
        stage = int(kind[-1])
        zero = dszero.ZeroOptimizer(model, optimizer, ZeroConfig(stage=stage, overlap_comm=stage == 2,
                                                                 reduce_bucket_size=5_000_000,
                                                                 stage3_prefetch_bucket_size=5_000_000))

        def backward(tokens):
            zero.backward(model(tokens))

        def update():
            zero.step()
            zero.zero_grad()
    gen = torch.Generator().manual_seed(rank)
    totals, updates = [], []
    for i in range(steps + 2):  # two warm-up steps
        tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
        torch.distributed.barrier()
        began = time.perf_counter()
        backward(tokens)
        middle = time.perf_counter()
        update()
        ended = time.perf_counter()
        if i >= 2:
            totals.append(ended - began)
            updates.append(ended - middle)
    states = state_bytes(optimizer) if kind == "ddp" else zero.memory_report()["optimizer_state"]
    return {"step_s": statistics.median(totals), "update_s": statistics.median(updates), "state_bytes": states,
            "params": sum(p.numel() for p in model.parameters()),
            "muon_params": sum(p.numel() for p in model.parameters() if p.use_muon)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kinds", default="zero0,zero1,zero2,zero3")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    rows: dict[str, list[dict]] = {k: [] for k in ["ddp", *kinds]}
    ratios: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    shape = (args.steps, args.d_model, args.layers, args.heads)
    for _ in range(args.rounds):
        for kind in kinds:
            anchor = max(run_ranks(run, 2, "ddp", *shape, timeout=3600), key=lambda r: r["step_s"])
            other = max(run_ranks(run, 2, kind, *shape, timeout=3600), key=lambda r: r["step_s"])
            rows["ddp"].append(anchor)
            rows[kind].append(other)
            ratios[kind].append((other["step_s"] / anchor["step_s"], other["update_s"] / anchor["update_s"]))
    first = rows["ddp"][0]
    print(f"example GPT d_model {args.d_model}, {args.layers} layers, {args.heads} heads, vocab {VOCAB}, seq {SEQ}: "
          f"{first['params'] / 1e6:.1f}M parameters ({first['muon_params'] / 1e6:.1f}M on Muon); 2 gloo ranks, fp32, "
          f"micro-batch {MICRO}; {args.steps} timed steps x {args.rounds} round(s)")
    print(f"{'config':<8}{'train step (s)':>16}{'x DDP':>8}{'step() (s)':>12}{'x DDP':>8}{'opt. state/rank (MB)':>22}"
          f"{'x zero0':>9}")
    base_state = rows["zero0"][0]["state_bytes"] if rows.get("zero0") else first["state_bytes"]
    for kind in rows:
        step = statistics.median(r["step_s"] for r in rows[kind])
        update = statistics.median(r["update_s"] for r in rows[kind])
        step_ratio = f"{statistics.median(r[0] for r in ratios[kind]):.2f}" if kind in ratios else "1.00"
        update_ratio = f"{statistics.median(r[1] for r in ratios[kind]):.2f}" if kind in ratios else "1.00"
        state = rows[kind][0]["state_bytes"]
        print(f"{kind:<8}{step:>16.3f}{step_ratio:>8}{update:>12.3f}{update_ratio:>8}{state / 2**20:>22.1f}"
              f"{state / base_state:>9.2f}")
    for kind in kinds:
        print(f"per round {kind}: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in ratios[kind]) + " (train/step x DDP)")


if __name__ == "__main__":
    main()
