"""random-LTD: forward + backward of a transformer layer wrapped to keep 50% of the tokens, against the
unwrapped layer on all of them.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsdata/bench/bench_random_ltd.py

The layer is a pre-norm GPT block (causal attention through scaled_dot_product_attention, 4x MLP) in
float32 on the CPU (or CUDA when present). The two are timed alternately, `repeats` times each, and the
medians compared; the wrapped time includes drawing the kept tokens, the gather and the scatter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

from dsdata import RandomLayerTokenDrop, RandomLTDScheduler


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, d))
        return x + self.mlp(self.norm2(x))


def time_layer(layer: nn.Module, x: torch.Tensor) -> float:
    if x.grad is not None:
        x.grad = None
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    layer(x).sum().backward()
    sync()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--keep", type=float, default=0.5, help="fraction of the tokens the wrapped layer keeps")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {device}, {torch.get_num_threads()} "
          f"torch threads")
    torch.manual_seed(0)
    plain = Block(args.d_model, args.heads).to(device)
    wrapped = RandomLayerTokenDrop(plain)
    kept = int(args.seq * args.keep)
    scheduler = RandomLTDScheduler({"total_layer_num": 1, "random_ltd_layer_num": 1, "random_ltd_schedule": {
        "min_value": kept, "max_value": args.seq, "schedule_config": {"require_steps": 10**9, "seq_per_step": 1}}},
        global_batch_size=args.batch)
    wrapped.init_config({"hidden_state_order": "batch_seq_dim", "model_type": "decoder"}, scheduler, 0)
    wrapped.train()
    x = torch.randn(args.batch, args.seq, args.d_model, device=device, requires_grad=True)
    for layer in (plain, wrapped, plain, wrapped):  # warm-up
        time_layer(layer, x)
    full, dropped = [], []
    for _ in range(args.repeats):
        full.append(time_layer(plain, x))
        dropped.append(time_layer(wrapped, x))
    full_ms, dropped_ms = statistics.median(full) * 1e3, statistics.median(dropped) * 1e3
    print(f"layer forward + backward, batch {args.batch} x seq {args.seq} x d {args.d_model}: all tokens "
          f"{full_ms:.1f} ms, random-LTD keeping {kept} ({args.keep:.0%}) {dropped_ms:.1f} ms -> "
          f"{full_ms / dropped_ms:.2f}x (medians of {args.repeats})")
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
