"""A small BERT for masked-LM pre-training on characters: embeddings, a stack of encoder layers, a head.

The encoder layers are either DeepSpeedTransformerLayer (the transformer kernel, built as DeepSpeed's
tutorial builds them) or BertLayer below, the same pre-LN math in plain torch.nn, so the two train the same
model and their losses compare.
"""

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from dstrain.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

VOCAB = 257  # 256 byte values and [MASK]
MASK_ID = 256


class BertLayer(nn.Module):
    """A pre-LN BERT encoder layer from torch.nn (tanh GeLU, as the kernel computes it)."""

    def __init__(self, hidden: int, heads: int, dropout: float, initializer_range: float, layers: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.output = nn.Linear(4 * hidden, hidden)
        self.dropout = dropout
        with torch.no_grad():  # the kernel's init: output projections scaled for the residual stream
            for linear, std in ((self.qkv, initializer_range), (self.intermediate, initializer_range),
                                (self.attn_out, initializer_range / math.sqrt(2 * layers)),
                                (self.output, initializer_range / math.sqrt(2 * layers))):
                linear.weight.normal_(0.0, std)
                linear.bias.zero_()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=p)
        x = x + F.dropout(self.attn_out(context.transpose(1, 2).reshape(batch, seq, hidden)), p, self.training)
        ff = self.output(F.gelu(self.intermediate(self.attn_norm(x)), approximate="tanh"))
        return x + F.dropout(ff, p, self.training)


class BertMLM(nn.Module):
    """Embeddings, `layers` encoder layers, a final LayerNorm (pre-LN) and the masked-LM head.

    forward(batch) takes [batch, 2, seq]: masked inputs and labels (-100 where nothing is predicted),
    and returns the mean cross-entropy over the masked positions.
    """

    def __init__(self, seq: int, hidden: int, layers: int, heads: int, dropout: float = 0.1,
                 kernel_config: DeepSpeedTransformerConfig | None = None):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, hidden)
        self.positions = nn.Embedding(seq, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.embed_dropout = nn.Dropout(dropout)
        if kernel_config is not None:  # the tutorial's way: one layer spec copied num_hidden_layers times
            self.layer = nn.ModuleList([copy.deepcopy(DeepSpeedTransformerLayer(kernel_config))
                                        for _ in range(kernel_config.num_hidden_layers)])
        else:
            self.layer = nn.ModuleList([BertLayer(hidden, heads, dropout, 0.02, layers) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        inputs, labels = batch[:, 0], batch[:, 1]
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.embed_dropout(self.embed_norm(self.tokens(inputs) + self.positions(positions)))
        for layer in self.layer:
            x = layer(x)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


class MaskedChars(torch.utils.data.Dataset):
    """BERT's masking over windows of characters: 15% of positions are predicted; of those 80% become
    [MASK], 10% a random byte, 10% stay. Each window's masking is fixed by (seed, index)."""

    def __init__(self, windows: torch.utils.data.Dataset, seq: int, seed: int, rate: float = 0.15):
        self.windows, self.seq, self.seed, self.rate = windows, seq, seed, rate

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> torch.Tensor:
        tokens = self.windows[index][:self.seq]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        draw = torch.rand(self.seq, generator=generator)
        chosen = draw < self.rate
        labels = torch.where(chosen, tokens, -100)
        inputs = tokens.clone()
        inputs[draw < self.rate * 0.8] = MASK_ID
        randomized = (draw >= self.rate * 0.8) & (draw < self.rate * 0.9)
        inputs[randomized] = torch.randint(0, 256, (int(randomized.sum()),), generator=generator)
        return torch.stack([inputs, labels])
