"""PR-MoE (Pyramid-Residual MoE, the MoE-for-NLG tutorial): layers built from a per-layer list of
expert counts (the tutorial's `--num-experts 32 32 64 64`: more experts near the output) and, with
`mlp_type="residual"`, Residual MoE layers (a dense MLP beside the experts, mixed per token).

Every layer a builder returns is called as `layer(hidden) -> (output, l_aux, exp_counts)`; a layer
of one expert is a plain dense MLP (DenseMLP) that reports l_aux 0, as Megatron-DeepSpeed builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .errors import MoEError
from .layer import MoE

MLP_TYPES = ("standard", "residual")


class DenseMLP(nn.Module):
    """A dense layer with an MoE layer's calling convention: (output, l_aux = 0, exp_counts = None)."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, hidden_states: torch.Tensor, used_token: torch.Tensor | None = None):
        out = self.mlp(hidden_states)
        out = out[0] if isinstance(out, tuple) else out
        return out, hidden_states.new_zeros(()).float(), None


def expand_num_experts(num_experts: int | Sequence[int], num_layers: int) -> list[int]:
    """One expert count per MoE layer: a single count repeats; a list must have one count per layer."""
    if isinstance(num_experts, int) and not isinstance(num_experts, bool):
        counts = [num_experts] * num_layers
    else:
        counts = list(num_experts)
        if len(counts) != num_layers:
            raise MoEError(f"num_experts lists {len(counts)} count(s) {counts} for {num_layers} MoE layer(s): give one "
                           f"count per layer, or a single count for all of them")
    bad = [c for c in counts if not isinstance(c, int) or isinstance(c, bool) or c < 1]
    if bad:
        raise MoEError(f"num_experts {counts}: every count must be a positive integer (bad: {bad})")
    return counts


def pyramid_layers(hidden_size: int, make_expert: Callable[[], nn.Module], num_experts: int | Sequence[int],
                   num_layers: int | None = None, *, ep_size: int = 1, mlp_type: str = "standard",
                   **moe_kwargs: Any) -> nn.ModuleList:
    """One layer per expert count: MoE(hidden_size, make_expert(), count, ep_size=min(ep_size, count),
    use_residual=mlp_type == "residual", **moe_kwargs), or DenseMLP(make_expert()) for a count of 1.

    A layer of fewer experts than ep_size spreads them over as many ranks as it has experts."""
    if mlp_type not in MLP_TYPES:
        raise MoEError(f"mlp_type={mlp_type!r} must be one of {', '.join(MLP_TYPES)}")
    counts = expand_num_experts(num_experts, num_layers if num_layers is not None else
                                (1 if isinstance(num_experts, int) else len(num_experts)))
    layers = []
    for count in counts:
        if count == 1:
            layers.append(DenseMLP(make_expert()))
        else:
            layers.append(MoE(hidden_size, make_expert(), num_experts=count, ep_size=min(ep_size, count),
                              use_residual=mlp_type == "residual", **moe_kwargs))
    return nn.ModuleList(layers)
