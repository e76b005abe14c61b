"""A small transformer and its data, the same on every rank, for ZeRO's tests."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        # No projection biases: the key bias has an exactly-zero gradient (softmax ignores a shift), and
        # Adam turns the rounding noise of a zero gradient into full-size updates that differ run to run.
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=False)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2, heads: int = 4, seq: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.blocks(x))


def make_model(seed: int = 0, **kwargs) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(**kwargs)


def batches(steps: int, micro: int, world: int, rank: int, micro_batch: int = 4, seq: int = 16, vocab: int = 64):
    """Per step, per micro-step, this rank's slice of one global batch (identical across world sizes)."""
    gen = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        global_batch = torch.randint(0, vocab, (micro * micro_batch * world, seq + 1), generator=gen)
        chunks = global_batch.chunk(micro)
        yield [chunk.chunk(world)[rank] for chunk in chunks]


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
