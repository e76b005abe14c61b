"""The models, data and configs of the DeepSpeed interop fixtures, shared by the script that writes them
with DeepSpeed (fixtures/make_deepspeed_fixtures.py, in a throwaway venv) and the tests that load them
with dstrain. Plain torch only: both sides must build the very same modules from the very same batches.

Every step trains on one global batch of GLOBAL_BATCH sequences, cut into equal micro-batches over the
data-parallel ranks and accumulation steps, so a run at 1 rank and a run at 2 ranks take the same step;
the loss of a step is the mean of its micro-batches' losses.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, SEQ = 48, 24, 12
GLOBAL_BATCH = 8
STEPS_BEFORE_SAVE = 3
STEPS_AFTER_SAVE = 3
CLIENT_STATE = {"note": "written by DeepSpeed", "epoch": 1, "history": [0.5, 0.25]}


class Block(nn.Module):
    """A residual MLP block (the layers of TinyLM, engine_models.py, as one module for a pipeline)."""

    def __init__(self, d: int = WIDTH):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class LM(nn.Module):
    """Tokens in, mean next-token loss out."""

    def __init__(self, vocab: int = VOCAB, d: int = WIDTH, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        for block in self.blocks:
            x = block(x)
        return lm_loss(self.head(x), tokens[:, 1:])


def lm_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_lm(seed: int = 0) -> LM:
    torch.manual_seed(seed)
    return LM()


def pipeline_layers(vocab: int = VOCAB, d: int = WIDTH, blocks: int = 2) -> list:
    """The pipeline's layer list: (embedding, blocks..., head); the pipeline's loss_fn is lm_loss."""
    return [nn.Embedding(vocab, d), *(Block(d) for _ in range(blocks)), nn.Linear(d, vocab)]


def all_tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, ((STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE) * GLOBAL_BATCH, SEQ + 1), generator=gen)


def micro_batches(step: int, dp_rank: int, dp_size: int, accumulation: int) -> list[torch.Tensor]:
    """This data-parallel rank's micro-batches of global step `step` (0-based)."""
    rows = all_tokens()[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
    micro = GLOBAL_BATCH // (dp_size * accumulation)
    mine = rows[dp_rank * micro * accumulation:(dp_rank + 1) * micro * accumulation]
    return [mine[i * micro:(i + 1) * micro] for i in range(accumulation)]


def config(stage: int, *, dtype: str = "fp32", dp_size: int = 2, pipeline: bool = False) -> dict:
    """The DeepSpeed config of a fixture at `dp_size` data-parallel ranks (the same global batch at any size)."""
    accumulation = 2 if pipeline else GLOBAL_BATCH // (4 * dp_size)
    cfg = {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // (dp_size * accumulation),
           "gradient_accumulation_steps": accumulation, "steps_per_print": 10_000, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                        "warmup_num_steps": 4}},
           "zero_optimization": {"stage": stage}}
    if stage == 3:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


EXPERTS = 4


class MoELM(nn.Module):
    """LM with one MoE layer; `moe_class` is DeepSpeed's MoE (writing the fixture) or dstrain's (loading it)."""

    def __init__(self, moe_class, ep_size: int, vocab: int = VOCAB, d: int = WIDTH):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        expert = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        # No random token selection and no noisy gate: both implementations route the same tokens.
        self.moe = moe_class(d, expert, num_experts=EXPERTS, ep_size=ep_size, k=1, capacity_factor=2.0,
                             min_capacity=4, use_rts=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        out, l_aux, _ = self.moe(x)
        return lm_loss(self.head(x + out), tokens[:, 1:]) + 0.01 * l_aux


def make_moe_lm(moe_class, ep_size: int, seed: int = 0) -> MoELM:
    torch.manual_seed(seed)
    return MoELM(moe_class, ep_size)
