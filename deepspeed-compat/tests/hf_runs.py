"""What the Hugging Face tests share: a tiny Llama from a config (nothing downloaded), token data, DeepSpeed
configs with the "auto" values the Trainer fills, and joining a gloo rank the way Accelerate expects."""

from __future__ import annotations

import os
from typing import Any

import torch

HIDDEN = 32


def tiny_llama_config(**overrides: Any):
    from transformers import LlamaConfig

    settings = {"vocab_size": 64, "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
                "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return LlamaConfig(**{**settings, **overrides})


def tiny_llama(seed: int = 0, **overrides: Any):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(**overrides))


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences, each its own label (causal LM)."""

    def __init__(self, count: int = 32, length: int = 8):
        self.ids = torch.randint(3, 64, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def auto_config(stage: int, gather_16bit: bool = True) -> dict[str, Any]:
    """A config as people write them for the Trainer: every value the Trainer knows left "auto"."""
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": "auto"}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto",
                    stage3_gather_16bit_weights_on_model_save=gather_16bit)
    return {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                      "weight_decay": "auto"}},
            "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                              "warmup_num_steps": "auto", "total_num_steps": "auto"}},
            "zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}


def filled_config(stage: int, world: int, *, micro: int, lr: float, steps: int) -> dict[str, Any]:
    """auto_config as the Trainer fills it for TrainingArguments(per_device_train_batch_size=micro,
    learning_rate=lr, max_steps=steps) and the other defaults (no warmup, max_grad_norm 1, AdamW's betas)."""
    cfg = auto_config(stage)
    cfg.update(train_micro_batch_size_per_gpu=micro, train_batch_size=micro * world, gradient_accumulation_steps=1,
               gradient_clipping=1.0, bf16={"enabled": False}, fp16={"enabled": False})
    cfg["optimizer"]["params"] = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    cfg["scheduler"]["params"] = {"warmup_min_lr": 0, "warmup_max_lr": lr, "warmup_num_steps": 1,
                                  "total_num_steps": steps}
    zero = cfg["zero_optimization"]
    zero["reduce_bucket_size"] = HIDDEN * HIDDEN
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * HIDDEN * HIDDEN),
                    stage3_param_persistence_threshold=10 * HIDDEN)
    return cfg


def join_as_accelerate_rank(rank: int, world: int) -> None:
    """In a rank of dscomm.testing.run_ranks (its gloo group already formed): the environment a launcher gives
    each process, and Accelerate's state on the gloo backend with DeepSpeed on. Accelerate picks a backend only
    where it finds an accelerator (on GPUs it is nccl), so a CPU run names gloo; TrainingArguments then takes
    this state with accelerator_config={"use_configured_state": True}."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      ACCELERATE_USE_DEEPSPEED="true")
    from accelerate import PartialState

    PartialState(backend="gloo")


def reset_accelerate() -> None:
    """Accelerate keeps one DeepSpeed plugin per process: drop it before the next Trainer or Accelerator."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()


def mean_over_ranks(value: float) -> float:
    tensor = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(tensor)
    return tensor.item() / torch.distributed.get_world_size()
