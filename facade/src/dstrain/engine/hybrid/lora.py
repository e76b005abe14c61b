"""LoRA as DeepSpeed-Chat writes it: modules with `fuse_lora_weight()` / `unfuse_lora_weight()` are fused
for generation and unfused after. Fusing adds scaling * A @ B into the base weight and unfusing
subtracts it, which rounds: the base weights are put back bit for bit afterwards, so training sees
exactly the weights it had."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def lora_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules()
            if callable(getattr(m, "fuse_lora_weight", None)) and callable(getattr(m, "unfuse_lora_weight", None))]


@contextlib.contextmanager
def fused(modules: list[torch.nn.Module]) -> Iterator[None]:
    """LoRA fused into the base weights inside the block (their weights must be readable: gathered at ZeRO-3)."""
    if not modules:
        yield
        return
    saved = [[(p, p.detach().clone()) for p in m.parameters(recurse=False)] for m in modules]
    try:
        with torch.no_grad():
            for module in modules:
                module.fuse_lora_weight()
        yield
    finally:
        with torch.no_grad():
            for module, params in zip(modules, saved):
                module.unfuse_lora_weight()
                for param, value in params:
                    param.copy_(value)
