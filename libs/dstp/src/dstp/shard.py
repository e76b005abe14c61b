"""Cut a whole tensor into its tensor-parallel shards and put shards back together, by a ParamPlan."""

from __future__ import annotations

import torch

from .plan import ParamPlan


def shard_tensor(full: torch.Tensor, plan: ParamPlan, rank: int, tp_size: int) -> torch.Tensor:
    """Rank `rank`'s piece of every sub-parameter of `full`, side by side (a new contiguous tensor)."""
    if not plan.sharded or tp_size == 1:
        return full.detach().clone()
    pieces = full.detach().split(list(plan.parts), dim=plan.dim)
    return torch.cat([piece.chunk(tp_size, dim=plan.dim)[rank] for piece in pieces], dim=plan.dim).contiguous()


def merge_shards(shards: list[torch.Tensor], plan: ParamPlan) -> torch.Tensor:
    """The whole tensor from every rank's shard, in rank order (the inverse of shard_tensor)."""
    if not plan.sharded or len(shards) == 1:
        return shards[0].detach().clone()
    tp_size = len(shards)
    local = [part // tp_size for part in plan.parts]
    per_rank = [shard.detach().split(local, dim=plan.dim) for shard in shards]
    return torch.cat([torch.cat([per_rank[r][i] for r in range(tp_size)], dim=plan.dim) for i in range(len(local))],
                     dim=plan.dim)
