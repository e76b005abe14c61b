"""A small GPT (pre-norm decoder, causal attention) for the main example.

The output layer is its own module rather than tied to the embedding: under ZeRO stage 3 a module's
parameters are gathered for that module's forward, so a weight read from elsewhere would be empty.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, d))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """forward(tokens) -> mean next-token cross-entropy over tokens[:, 1:]."""

    def __init__(self, vocab: int = 256, seq: int = 128, d_model: int = 128, layers: int = 4, heads: int = 4,
                 checkpoint_fn=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpoint_fn = checkpoint_fn  # dstrain.checkpointing.checkpoint with --activation-checkpointing
        for weight in (self.embed.weight, self.pos.weight, self.head.weight):
            nn.init.normal_(weight, std=0.02)  # small logits at the start: the first loss is near ln(256)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):  # GPT-2's scaled residual init
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs) + self.pos(torch.arange(inputs.shape[1], device=inputs.device))
        for block in self.blocks:
            x = self.checkpoint_fn(block, x) if self.checkpoint_fn is not None and self.training else block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
