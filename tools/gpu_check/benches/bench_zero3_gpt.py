"""One training step of the example GPT (facade/examples/gpt_model.py: 12 layers, d_model 1024, 16 heads, 512
tokens, batch 8, about 150M parameters) with dstrain's ZeRO-3 in bf16 on one GPU, against plain PyTorch on the
same GPU: the same model in float32 under torch.autocast(bf16) with a fused AdamW, and the same gradient
clipping. Target: dstrain's step <= 1.1x plain PyTorch's.

    python tools/gpu_check/benches/bench_zero3_gpt.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, device, figure, interleaved, median, parse, write

import dstrain

sys.path.insert(0, str(ROOT / "facade" / "examples"))
from gpt_model import GPT

LR = 1e-4


def main() -> None:
    args = parse(__doc__)
    seq, d_model, layers, heads, batch, rounds, iters = ((16, 32, 1, 2, 2, 2, 1) if args.smoke
                                                         else (512, 1024, 12, 16, 8, 5, 4))
    dev = device()
    dstrain.init_distributed()  # a world of one: NCCL on the GPU
    tokens = torch.randint(0, 256, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).to(dev)

    torch.manual_seed(0)
    plain = GPT(seq=seq, d_model=d_model, layers=layers, heads=heads).to(dev)
    optimizer = torch.optim.AdamW(plain.parameters(), lr=LR, fused=dev.type == "cuda")

    def plain_step() -> None:
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = plain(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    model = GPT(seq=seq, d_model=d_model, layers=layers, heads=heads)
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "steps_per_print": 1_000_000, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 50_000_000,
                                    "stage3_param_persistence_threshold": 100_000}}
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(), config=config)

    def dstrain_step() -> None:
        loss = engine(tokens)
        engine.backward(loss)
        engine.step()

    times = interleaved({"dstrain": dstrain_step, "plain": plain_step}, rounds, iters, warmup=3)
    ours, anchor = median(times["dstrain"]) * 1e3, median(times["plain"]) * 1e3
    params = sum(p.numel() for p in plain.parameters())
    write(args, [figure("example GPT training step, ZeRO-3 bf16 on one GPU", ours, "ms",
                        "plain PyTorch (autocast bf16, fused AdamW)", anchor, "<= 1.1", rounds,
                        shape=f"{layers} layers, d_model {d_model}, {heads} heads, seq {seq}, batch {batch}, "
                              f"{params / 1e6:.1f}M parameters",
                        per_round_ms={k: [round(t * 1e3, 3) for t in v] for k, v in times.items()})])
    engine.destroy()


if __name__ == "__main__":
    main()
