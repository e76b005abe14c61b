"""The example GPT trained three ways in one world-of-one process, on the GPU when torch sees one (NCCL) and
on the CPU otherwise (gloo; run with CUDA_VISIBLE_DEVICES= for the CPU reference): float32 ZeRO-3 with
prefetching (and again with activation checkpointing to host memory), bf16 ZeRO-2, fp16 ZeRO-1 from an
overflowing loss scale. Prints one JSON line (losses, steps
applied, loss scales, prefetches, where the parameters lived). Run by test_gpu_training.py.

    python facade/tests/scripts/gpu_train_gpt.py
"""

import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import dstrain

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpt_model import GPT

SEQ, BATCH = 32, 8
OPTIMIZER = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}
RUNS = {
    # every unit partitioned and a prefetch bucket that holds about two of them: gathers run ahead of need
    "zero3_fp32": ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 40_000,
                                          "stage3_param_persistence_threshold": 0}}, 8),
    # the same with every block recomputed in backward, its saved inputs copied to pinned host memory on a side
    # stream (cpu_checkpointing): the losses must not change
    "zero3_fp32_checkpointed": ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 40_000,
                                                       "stage3_param_persistence_threshold": 0},
                                 "activation_checkpointing": {"cpu_checkpointing": True}}, 8),
    "bf16_zero2": ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, 10),
    # 2**26 / 256 tokens: the logits' gradient alone passes fp16's 65504, so the first steps overflow
    "fp16_zero1": ({"fp16": {"enabled": True, "initial_scale_power": 26, "hysteresis": 1},
                    "zero_optimization": {"stage": 1}}, 14),
}


def batches() -> torch.Tensor:
    """Two fixed batches of byte tokens, trained on in turn: the loss must fall."""
    return torch.randint(0, 256, (2, BATCH, SEQ + 1), generator=torch.Generator().manual_seed(17))


def train(extra: dict, steps: int) -> dict:
    torch.manual_seed(1234)
    checkpointed = "activation_checkpointing" in extra
    model = GPT(seq=SEQ, d_model=64, layers=2, heads=4,
                checkpoint_fn=dstrain.checkpointing.checkpoint if checkpointed else None)
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "steps_per_print": 10_000, "optimizer": OPTIMIZER, **extra}
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(), config=config)
    data = batches()
    record = {"loss": [], "applied": [], "scale": []}
    for step in range(steps):
        loss = engine(data[step % 2].to(engine.device))
        engine.backward(loss)
        engine.step()
        record["loss"].append(loss.item())
        record["applied"].append(engine.was_step_applied())
        record["scale"].append(float(engine.loss_scale))
    record["skipped_steps"] = engine.skipped_steps
    record["param_devices"] = sorted({p.device.type for p in model.parameters()})
    record["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    record["prefetched"] = sum(getattr(unit, "prefetch_count", 0) for unit in getattr(engine.optimizer, "groups", []))
    engine.destroy()
    return record


def main() -> None:
    if torch.cuda.is_available():  # float32 means float32: no TF32 in matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dstrain.init_distributed()
    result = {"device": "cuda" if torch.cuda.is_available() else "cpu",
              "backend": torch.distributed.get_backend()}
    with sdpa_kernel([SDPBackend.MATH]):  # the same attention arithmetic on both devices
        for name, (extra, steps) in RUNS.items():
            result[name] = train(extra, steps)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
