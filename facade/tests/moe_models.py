"""A tiny language model with an MoE layer, and its one-process "DDP with experts" reference, for the facade's MoE tests."""

import torch
from torch import nn
from torch.nn import functional as F

import dsmoe

VOCAB, HIDDEN, SEQ, BATCH, EXPERTS = 32, 8, 6, 4, 4


class TinyMoELM(nn.Module):
    def __init__(self, ep_size: int = 1, k: int = 1, residual: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.moe = dsmoe.MoE(HIDDEN, nn.Sequential(nn.Linear(HIDDEN, 16), nn.GELU(), nn.Linear(16, HIDDEN)),
                             num_experts=EXPERTS, ep_size=ep_size, k=k, capacity_factor=1.0, min_capacity=0,
                             use_residual=residual)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        hidden = self.embed(tokens[:, :-1])
        out, l_aux, _ = self.moe(hidden)
        logits = self.head(hidden + out)
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) + 0.01 * l_aux


def distinct_experts(model: nn.Module) -> None:
    """Every expert different, by global id, so a layout that misplaces one cannot pass."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "deepspeed_experts." in name:
                expert = int(name.split("deepspeed_experts.")[1].split(".")[0])
                gen = torch.Generator().manual_seed(expert * 100 + len(name))
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1000 * step + rank))


def seed_gate(model: nn.Module, step: int, rank: int) -> None:
    """The gate's random token selection draws from a generator known to the reference too."""
    for _, layer in dsmoe.moe_layers(model):
        layer.deepspeed_moe.gate.generator = torch.Generator().manual_seed(7 * step + rank)


def reference(world: int, steps: int, clip: float, lr: float = 0.05, residual: bool = False):
    """One process running every rank's batch: losses (mean over ranks), grad norms, final weights by name."""
    model = TinyMoELM(residual=residual)
    distinct_experts(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, norms = [], []
    for step in range(steps):
        total = 0.0
        for rank in range(world):
            seed_gate(model, step, rank)
            loss = model(batch(step, rank)) / world
            loss.backward()
            total += loss.item()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(total)
        norms.append(norm)
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}
