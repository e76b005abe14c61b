"""DeepSpeedTransformerLayer (torch path) forward + backward against torch.nn.TransformerEncoderLayer and
against torch.compile of a BERT layer written from torch.nn, at BERT-large's shape; then the activation
bytes each memory flag saves (saved-tensor hooks) and the time it costs.

All variants run in this one process, interleaved pass by pass (each pass runs every variant once); the
ratio to TransformerEncoderLayer is taken within each pass and its median and quartiles printed.

    flock /tmp/dstrain-bench.lock python facade/bench/bench_transformer_layer.py --rounds 5 --iters 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from transformer_reference import ReferenceBertLayer

from dstrain.ops.kernels import backend_name
from dstrain.ops.transformer import (
    DeepSpeedTransformerConfig,
    DeepSpeedTransformerLayer,
    count_saved_activations,
)

FLAGS = ("normalize_invertible", "attn_dropout_checkpoint", "gelu_checkpoint")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1, help="attention and hidden dropout, all variants")
    parser.add_argument("--post-ln", action="store_true", help="post-LN (default pre-LN, as the tutorial)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3, help="passes per round (rounds x iters passes in all)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile of the reference")
    parser.add_argument("--no-flags", action="store_true", help="leave out the per-flag timings")
    return parser.parse_args()


def ds_layer(args, **flags) -> DeepSpeedTransformerLayer:
    torch.manual_seed(0)
    config = DeepSpeedTransformerConfig(
        batch_size=args.batch, hidden_size=args.hidden, heads=args.heads, intermediate_size=4 * args.hidden,
        attn_dropout_ratio=args.dropout, hidden_dropout_ratio=args.dropout, num_hidden_layers=24,
        initializer_range=0.02, pre_layer_norm=not args.post_ln, seed=1234, **flags)
    return DeepSpeedTransformerLayer(config)


def variants(args) -> dict:
    """name -> (module, step(x, mask)) where step runs forward and backward once."""
    mask = torch.zeros(args.batch, 1, 1, args.seq)
    mask[0, ..., args.seq * 3 // 4:] = -10000.0  # some padding, as BERT batches have
    pad = mask.view(args.batch, args.seq) < 0
    made = {}

    def add(name, module, forward):
        def step(x):
            out = forward(x)
            out.backward(torch.ones_like(out))
        made[name] = (module, step)

    ours = ds_layer(args)
    add("ours", ours, lambda x: ours(x, mask))
    encoder = torch.nn.TransformerEncoderLayer(args.hidden, args.heads, 4 * args.hidden, dropout=args.dropout,
                                               activation="gelu", batch_first=True, norm_first=not args.post_ln)
    add("TransformerEncoderLayer", encoder, lambda x: encoder(x, src_key_padding_mask=pad))
    if not args.no_compile:
        reference = ReferenceBertLayer(args.hidden, args.heads, 4 * args.hidden, not args.post_ln,
                                       attn_p=args.dropout, hidden_p=args.dropout)
        compiled = torch.compile(reference)
        add("compiled reference", reference, lambda x: compiled(x, mask))
    if not args.no_flags:
        for flag in FLAGS:
            layer = ds_layer(args, **{flag: True})
            add(f"ours + {flag}", layer, lambda x, layer=layer: layer(x, mask))
        layer = ds_layer(args, **dict.fromkeys(FLAGS, True))
        add("ours + all three", layer, lambda x, layer=layer: layer(x, mask))
    return made




def main() -> None:
    args = parse_args()
    x = torch.randn(args.batch, args.seq, args.hidden, requires_grad=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kernels: {backend_name(x.detach())}; "
          f"batch {args.batch} x seq {args.seq}, hidden {args.hidden}, {args.heads} heads, dropout {args.dropout}, "
          f"{'post' if args.post_ln else 'pre'}-LN, fp32", flush=True)
    made = variants(args)
    began = time.perf_counter()
    for _, step in made.values():  # warm-up (and torch.compile's compilation)
        step(x)
        step(x)
    print(f"warm-up (incl. compile) {time.perf_counter() - began:.0f} s", flush=True)

    # Interleaved at the finest grain: each pass runs every variant once, so load from elsewhere on the
    # machine falls on all of them alike; a ratio is taken within each pass.
    times = {name: [] for name in made}
    for _ in range(args.rounds * args.iters):
        for name, (_, step) in made.items():
            start = time.perf_counter()
            step(x)
            times[name].append(time.perf_counter() - start)

    base = times["TransformerEncoderLayer"]
    print("\n| variant | fwd+bwd median (min) | / TransformerEncoderLayer, median of passes (quartiles) "
          "| activation bytes saved |")
    print("|---|---|---|---|")
    for name, (module, step) in made.items():
        ratios = sorted(a / b for a, b in zip(times[name], base))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        with count_saved_activations(module.parameters()) as saved:
            step(x)
        print(f"| {name} | {statistics.median(times[name]) * 1e3:.0f} ms ({min(times[name]) * 1e3:.0f} ms) "
              f"| {statistics.median(ratios):.3f} ({quartiles[0]:.2f}-{quartiles[2]:.2f}) "
              f"| {saved.bytes / 2**20:.1f} MiB |", flush=True)


if __name__ == "__main__":
    main()
