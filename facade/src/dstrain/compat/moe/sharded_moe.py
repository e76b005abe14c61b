"""`deepspeed.moe.sharded_moe`: the gate, the routing layer and the gating functions (dsmoe's), with DeepSpeed's
signatures: `ep_group` (drop_tokens=False: the capacity is the busiest expert's load over that group, one
all-reduce MAX through this module's `dist`, none for a group of one or None) and `sparse_routes` (the routes as
k rows of S: experts, slots and weights, a dropped route's expert -1). `_route_slots` / `_sparse_encode` /
`_sparse_decode` are the dispatch over that layout (dsmoe's `route_slots` / `encode_routes` / `decode_routes`).
Tutel is not used: `TUTEL_INSTALLED` is False and `use_tutel=True` is refused by name."""

from __future__ import annotations

from typing import Any

import torch

from dsmoe.errors import MoEError
from dsmoe.gating import decode_routes, encode_routes, route_slots, route_top1, route_top2, route_topk
from dsmoe.sharded_moe import MOELayer, TopKGate, gumbel_rsample, multiplicative_jitter

from ... import comm as dist

TUTEL_INSTALLED = False

# DeepSpeed's names for the dispatch over routes as k rows of S.
_route_slots = route_slots
_sparse_encode = encode_routes
_sparse_decode = decode_routes


def _max_load_over(ep_group: Any, device: torch.device):
    """The reduce_max_load of dsmoe's gating for `ep_group`: None where there is nothing to agree on."""
    if ep_group is None or dist.get_world_size(group=ep_group) <= 1:
        return None

    def reduce(local: int) -> int:
        load = torch.tensor([local], dtype=torch.int64, device=device)
        dist.all_reduce(load, op=dist.ReduceOp.MAX, group=ep_group)
        return int(load.item())

    return reduce


def _outputs(routing, k: int, sparse_routes: bool):
    return routing.deepspeed_sparse_outputs(k) if sparse_routes else routing.deepspeed_outputs()


def _no_tutel(use_tutel: bool) -> None:
    if use_tutel:
        raise MoEError("top1gating: use_tutel=True needs Tutel's kernels, which dstrain does not use; leave it False "
                       "(sparse_routes=True gives a gather-based dispatch layout instead)")


def top1gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, used_token: torch.Tensor | None = None,
               noisy_gate_policy: str | None = None, drop_tokens: bool = True, use_rts: bool = True,
               ep_group: Any = None, sparse_routes: bool = False, use_tutel: bool = False):
    """DeepSpeed's top1gating: (l_aux, combine_weights, dispatch_mask, exp_counts), or with sparse_routes
    (l_aux, capacity, num_experts, experts [1, S], slots [1, S], weights [1, S], exp_counts)."""
    _no_tutel(use_tutel)
    reduce = None if drop_tokens else _max_load_over(ep_group, logits.device)
    routing = route_top1(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy, drop_tokens, use_rts,
                         reduce_max_load=reduce)
    return _outputs(routing, 1, sparse_routes)


def top2gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
               ep_group: Any = None, top2_2nd_expert_sampling: bool = True, sparse_routes: bool = False):
    """DeepSpeed's top2gating; with sparse_routes the routes as 2 rows of S, heaviest first."""
    reduce = None if drop_tokens else _max_load_over(ep_group, logits.device)
    routing = route_top2(logits, capacity_factor, min_capacity, drop_tokens,
                         top2_2nd_expert_sampling=top2_2nd_expert_sampling, reduce_max_load=reduce)
    return _outputs(routing, 2, sparse_routes)


def topkgating(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
               ep_group: Any = None, drop_policy: str = "probs", sparse_routes: bool = False):
    """DeepSpeed's topkgating; with sparse_routes the routes as k rows of S, heaviest first."""
    reduce = None if drop_tokens else _max_load_over(ep_group, logits.device)
    routing = route_topk(logits, k, capacity_factor, min_capacity, drop_tokens, drop_policy=drop_policy,
                         reduce_max_load=reduce)
    return _outputs(routing, k, sparse_routes)


__all__ = ["TUTEL_INSTALLED", "MOELayer", "TopKGate", "dist", "gumbel_rsample", "multiplicative_jitter", "top1gating",
           "top2gating", "topkgating"]
