"""Bytes per step and step time of ZeRO-3 against ZeRO++ (hpZ, qwZ, qgZ, each alone and all three).

4 gloo ranks on the CPU as 2 nodes of 2 (LOCAL_WORLD_SIZE=2 in every rank, as torchrun would set on
two machines; hpZ's zero_hpz_partition_size is 2). A GPT of 5.3M parameters (vocab 4096, d 256,
4 layers, seq 128, micro-batch 4 per rank) in bf16 (or --dtype fp16 / fp32: fp16 has the same bytes,
but the CPU computes it 9x slower), reuse off
(stage3_max_reuse_distance 0: every unit is gathered in forward and again in backward, as in models too
big to keep) and the default prefetch. Each kind runs in its own freshly forked ranks, kinds
alternating over rounds; printed per rank (rank 0): the bytes the comms logger counted in one step by
collective, the bytes that leave the node (a world-group op sends (W - h) / W of its bytes to the other
node's ranks, the across-node all-to-all (n - 1) / n, node-local ops none), and the median step time
(logger off) with its ratio to ZeRO-3 in the same round.

    python libs/dszero/bench/bench_zeropp.py [--steps 6] [--rounds 2] [--kinds zero3,qwz,qgz,hpz,all]
    python libs/dszero/bench/bench_zeropp.py --quantizers   # the torch quantizers' CPU throughput, 1 thread
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig
from dszero.zeropp import logged_bytes

VOCAB, D, LAYERS, SEQ, MICRO, WORLD, PER_NODE = 4096, 256, 4, 128, 4, 4, 2
KINDS = {"zero3": {}, "qwz": {"zero_quantized_weights": True}, "qgz": {"zero_quantized_gradients": True},
         "hpz": {"zero_hpz_partition_size": PER_NODE},
         "all": {"zero_quantized_weights": True, "zero_quantized_gradients": True,
                 "zero_hpz_partition_size": PER_NODE}}
NODE_LOCAL = {"zeropp_hpz_gather", "zeropp_qgz_within_node"}
ACROSS = {"zeropp_qgz_across_nodes"}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
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


def cross_node_fraction(name: str, group_size: int) -> float:
    if name in NODE_LOCAL:
        return 0.0
    if name in ACROSS:
        nodes = WORLD // PER_NODE
        return (nodes - 1) / nodes
    return (group_size - PER_NODE) / group_size if group_size == WORLD else 0.0


def run(rank: int, world: int, kind: str, steps: int, dtype: str) -> dict:
    os.environ["LOCAL_WORLD_SIZE"] = str(PER_NODE)
    torch.set_num_threads(1)  # 4 ranks share 2 cores
    torch.manual_seed(0)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = GPT().to(torch_dtype)
    cfg = ZeroConfig(stage=3, stage3_max_reuse_distance=0, **KINDS[kind])
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-4), cfg, precision=dtype)
    gen = torch.Generator().manual_seed(rank)

    def step() -> float:
        tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        return time.perf_counter() - start

    times = [step() for _ in range(steps + 1)][1:]  # the first step records prefetch's order
    dscomm.configure(enabled=True, prof_all=True)
    step()
    log = dscomm.get_comms_log()
    dscomm.configure(enabled=False)
    sizes = {name: next(iter(entries.values()))["group_size"] for name, entries in log.items()}
    by_name = logged_bytes(log)
    crossing = sum(n * cross_node_fraction(name, sizes[name]) for name, n in by_name.items())
    return {"time": statistics.median(times), "bytes": by_name, "cross_node": crossing,
            "params": sum(p.ds_numel for p in model.parameters())}


def quantizer_throughput() -> None:
    """Elements per second of quantize / dequantize (torch path, 1 thread, 4M bf16 elements, median of 7)."""
    from dszero.quantize import QuantSpec, dequantize, quantize

    torch.set_num_threads(1)
    numel = 1 << 22
    values = torch.randn(4, numel // 4).to(torch.bfloat16)
    for spec in (QuantSpec(8, 256), QuantSpec(8, 256, False), QuantSpec(4, 128), QuantSpec(4, 128, False)):
        packing, unpacking = [], []
        for _ in range(7):
            start = time.perf_counter()
            payload = quantize(values, spec)
            packing.append(time.perf_counter() - start)
            start = time.perf_counter()
            dequantize(payload, numel // 4, spec, dtype=torch.bfloat16)
            unpacking.append(time.perf_counter() - start)
        print(f"{spec}: quantize {numel / statistics.median(packing) / 1e6:.0f} M elements/s, dequantize "
              f"{numel / statistics.median(unpacking) / 1e6:.0f} M elements/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--dtype", default="bf16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--quantizers", action="store_true", help="only the quantizers' CPU throughput")
    args = parser.parse_args()
    if args.quantizers:
        quantizer_throughput()
        return
    kinds = [k for k in args.kinds.split(",") if k != "zero3"]
    results: dict[str, list[dict]] = {kind: [] for kind in ["zero3", *kinds]}
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        base = run_ranks(run, WORLD, "zero3", args.steps, args.dtype, timeout=1800)[0]
        results["zero3"].append(base)
        for kind in kinds:
            got = run_ranks(run, WORLD, kind, args.steps, args.dtype, timeout=1800)[0]
            results[kind].append(got)
            ratios[kind].append(got["time"] / base["time"])
    base = results["zero3"][0]
    print(f"{base['params'] / 1e6:.2f}M parameters, {args.dtype}, {WORLD} gloo ranks as {WORLD // PER_NODE} nodes of "
          f"{PER_NODE}; per rank, one step")
    print(f"{'kind':<6} {'weights':>10} {'gradients':>10} {'all bytes':>10} {'x less':>7} {'cross-node':>11} "
          f"{'x less':>7} {'step s':>7} {'x ZeRO-3':>9}")
    for kind, runs in results.items():
        got = runs[0]
        weights = sum(n for name, n in got["bytes"].items() if "gather" in name)
        grads = sum(n for name, n in got["bytes"].items() if "reduce_scatter" in name or "qgz" in name)
        total = sum(got["bytes"].values())
        ratio = statistics.median(ratios[kind]) if kind in ratios else 1.0
        step_time = statistics.median(r["time"] for r in runs)
        print(f"{kind:<6} {weights / 1e6:>9.2f}M {grads / 1e6:>9.2f}M {total / 1e6:>9.2f}M "
              f"{sum(base['bytes'].values()) / total:>7.2f} {got['cross_node'] / 1e6:>10.2f}M "
              f"{base['cross_node'] / got['cross_node']:>7.2f} {step_time:>7.3f} {ratio:>9.2f}")
    for kind, runs in results.items():
        print(kind, {name: n for name, n in sorted(runs[0]["bytes"].items())})


if __name__ == "__main__":
    main()
