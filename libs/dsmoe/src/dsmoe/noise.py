"""The random numbers gates use, each drawn from an explicit generator.

The values follow torch.distributions' formulas, as DeepSpeed's gates draw them: a generator seeded
as torch's default one gives the same numbers DeepSpeed would draw.
"""

from __future__ import annotations

import torch


def uniform(shape: torch.Size | tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None,
            low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """U(low, high) of `shape`, drawn on the generator's device and given `like`'s device and dtype."""
    device = generator.device if generator is not None else like.device
    draw = torch.rand(shape, generator=generator, device=device, dtype=like.dtype)
    if low != 0.0 or high != 1.0:
        draw = low + draw * (high - low)
    return draw.to(like.device)


def multiplicative_jitter(x: torch.Tensor, generator: torch.Generator | None = None,
                          epsilon: float = 1e-2) -> torch.Tensor:
    """x times U(1 - epsilon, 1 + epsilon), elementwise (the Switch Transformer's input jitter)."""
    if epsilon == 0:
        return x
    return x * uniform(x.shape, x, generator, 1.0 - epsilon, 1.0 + epsilon)


def gumbel_rsample(shape: torch.Size | tuple[int, ...], like: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise, -log(-log(u)) with u kept inside (0, 1) as torch's Gumbel does."""
    info = torch.finfo(like.dtype)
    u = uniform(shape, like, generator, info.tiny, 1.0 - info.eps)
    return -torch.log(-torch.log(u))
