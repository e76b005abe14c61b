"""Small models shared by dsmoe's tests."""

import torch
from torch import nn

HIDDEN, FFN = 8, 16


def mlp(hidden: int = HIDDEN, ffn: int = FFN) -> nn.Module:
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


def distinct_experts(layer: nn.Module, seed: int = 0) -> None:
    """Give every expert different weights, chosen by its global id (so any ep_size gets the same)."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if "deepspeed_experts." in name:
                expert = int(name.split("deepspeed_experts.")[1].split(".")[0])
                gen = torch.Generator().manual_seed(seed * 1000 + expert * 10 + len(name))
                param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)
