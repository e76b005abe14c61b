"""A tiny language model whose forward returns its loss, and a token dataset, for the engine's tests."""

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 48, d: int = 24, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(),
                                                  nn.Dropout(dropout), nn.Linear(2 * d, d)) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        for layer in self.layers:
            x = x + layer(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def make_model(seed: int = 0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(**kwargs)


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, size: int = 256, seq: int = 12, vocab: int = 48, seed: int = 7):
        gen = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (size, seq + 1), generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def config(micro: int = 4, gas: int = 1, stage: int = 0, **extra) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
           "steps_per_print": 10_000, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    cfg.update(extra)
    return cfg


ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
