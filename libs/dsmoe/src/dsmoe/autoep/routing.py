"""Token choice of AutoEP layers: scores in float32 from the router's logits, optional group-limited
routing, top-k, renormalisation and scaling (the reference's score_func, route_norm, route_scale,
routed_scaling_factor, num_expert_groups, num_limited_groups).

A correction bias (DeepSeek-V3's e_score_correction_bias) shifts the scores the choice is made on
only; the weights the experts' outputs get are the unshifted scores of the chosen experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RoutingSpec:
    num_experts: int
    top_k: int
    score_func: str  # "softmax" | "sigmoid"
    route_norm: bool
    scale: float  # route_scale x routed_scaling_factor
    num_groups: int | None = None
    limited_groups: int | None = None
    group_score: str = "max"  # "max" | "top2_sum"
    group_mask_value: float = float("-inf")


def route(logits: torch.Tensor, spec: RoutingSpec, correction_bias: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [tokens, top_k] float32, expert ids [tokens, top_k]) for router logits [tokens, experts]."""
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if spec.score_func == "softmax" else torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if spec.num_groups is not None and spec.limited_groups is not None and spec.limited_groups < spec.num_groups:
        choice = _limit_to_groups(choice, spec)
    indices = torch.topk(choice, spec.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if spec.route_norm:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if spec.scale != 1.0:
        weights = weights * spec.scale
    return weights, indices


def _limit_to_groups(choice: torch.Tensor, spec: RoutingSpec) -> torch.Tensor:
    """Scores outside each token's `limited_groups` best expert groups set to the mask value."""
    grouped = choice.view(choice.shape[0], spec.num_groups, -1)
    if spec.group_score == "top2_sum":
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    else:
        group_scores = grouped.max(dim=-1).values
    chosen = torch.topk(group_scores, spec.limited_groups, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), spec.group_mask_value).view_as(choice)
