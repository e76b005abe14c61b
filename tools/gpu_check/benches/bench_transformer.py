"""DeepSpeedTransformerLayer (Triton kernels on a GPU) forward + backward against
torch.nn.TransformerEncoderLayer, both pre-LN with dropout 0.1, at BERT-large's shape (hidden 1024, 16 heads,
intermediate 4096; batch 64 of 128 tokens) in bf16. Target: ours <= 0.8x torch's time.

    python tools/gpu_check/benches/bench_transformer.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device, figure, interleaved, median, parse, write

from dstrain.ops.kernels import backend_name
from dstrain.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

NAME = "transformer layer fwd+bwd, BERT-large shape, bf16"


def main() -> None:
    args = parse(__doc__)
    batch, seq, hidden, heads, rounds, iters = (2, 16, 64, 4, 2, 1) if args.smoke else (64, 128, 1024, 16, 7, 10)
    dev, dtype = device(), torch.bfloat16
    torch.manual_seed(0)
    ours = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(
        batch_size=batch, hidden_size=hidden, heads=heads, intermediate_size=4 * hidden, attn_dropout_ratio=0.1,
        hidden_dropout_ratio=0.1, num_hidden_layers=24, initializer_range=0.02, pre_layer_norm=True,
        seed=1234)).to(dev, dtype)
    theirs = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.1, activation="gelu",
                                              batch_first=True, norm_first=True, device=dev, dtype=dtype)
    x = torch.randn(batch, seq, hidden, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    mask = torch.zeros(batch, 1, 1, seq, device=dev, dtype=dtype)

    def run_ours() -> None:
        ours(x, mask).backward(grad)

    def run_theirs() -> None:
        theirs(x).backward(grad)

    times = interleaved({"ours": run_ours, "theirs": run_theirs}, rounds, iters)
    mine, anchor = median(times["ours"]) * 1e3, median(times["theirs"]) * 1e3
    write(args, [figure(NAME, mine, "ms", "torch.nn.TransformerEncoderLayer", anchor, "<= 0.8", rounds,
                        kernels=backend_name(x), shape=f"batch {batch}, seq {seq}, hidden {hidden}, heads {heads}",
                        per_round_ms={k: [round(t * 1e3, 4) for t in v] for k, v in times.items()})])


if __name__ == "__main__":
    main()
