"""Top-1, top-2 and top-k gating as pure functions, with DeepSpeed's names, arguments and results.

Each gate takes the logits of S tokens over E experts and decides, for every token, which experts it
goes to, the slot it takes in each expert's buffer of `capacity` slots, and the weight its expert's
output is combined with. `route_top1` / `route_top2` / `route_topk` return that decision compactly,
one row per kept route (a `Routing`, what the sparse dispatch reads); `top1gating` / `top2gating` /
`topkgating` return DeepSpeed's tensors: (l_aux, combine_weights [S, E, C], dispatch_mask [S, E, C],
exp_counts [E]). Where no token is dropped they equal DeepSpeed's for the same logits.

Nothing here talks to other ranks. With drop_tokens=False the capacity is the busiest expert's load
over the expert-parallel group: the caller passes `reduce_max_load` (the layer's all-reduce MAX).
Every random draw takes `generator` (None: torch's default generator, as DeepSpeed draws).

When an expert is offered more tokens than it has slots, these are kept:
- top-1, use_rts=True: random token selection (a uniform priority per token, highest kept);
- top-1, use_rts=False: the first tokens in sequence order (DeepSpeed keeps whichever torch.topk's
  tie order picks among equal priorities, which is not specified);
- top-2: first choices before second choices, each in sequence order (DeepSpeed's rule);
- top-k, drop_policy "probs": the highest gate probabilities, ties to the earlier token;
  "position": the first tokens in sequence order.
Kept tokens take their expert's slots in sequence order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .capacity import expert_capacity
from .errors import MoEError
from .noise import gumbel_rsample, uniform

MaxLoad = Callable[[int], int]  # this rank's busiest expert's load -> the largest over the group


@dataclass
class Routing:
    """Where each kept route goes: token `tokens[i]` to expert `experts[i]`, slot `slots[i]`, with
    combine weight `weights[i]` (differentiable). Slots of one expert are 0..n-1 for its n routes."""

    tokens: torch.Tensor
    experts: torch.Tensor
    slots: torch.Tensor
    weights: torch.Tensor
    num_tokens: int
    num_experts: int
    capacity: int
    l_aux: torch.Tensor
    exp_counts: torch.Tensor

    @classmethod
    def from_masks(cls, kept: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor, capacity: int,
                   l_aux: torch.Tensor, exp_counts: torch.Tensor) -> Routing:
        """From [S, E] matrices: which routes are kept, their slots and their weights."""
        tokens, experts = kept.nonzero(as_tuple=True)
        return cls(tokens, experts, locations[tokens, experts], weights[tokens, experts], kept.shape[0],
                   kept.shape[1], int(capacity), l_aux, exp_counts)

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(combine_weights [S, E, C], dispatch_mask [S, E, C]) as DeepSpeed's einsum dispatch reads them."""
        combine = self.weights.new_zeros(self.num_tokens, self.num_experts, self.capacity)
        combine = combine.index_put((self.tokens, self.experts, self.slots), self.weights)
        return combine, combine.bool()

    def deepspeed_outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        combine, dispatch = self.dense()
        return self.l_aux, combine, dispatch, self.exp_counts

    def per_route(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The routes as k rows of S (DeepSpeed's `sparse_routes` layout): (experts [k, S] int32, slots [k, S]
        int32, weights [k, S]). Row r holds each token's r-th route, its routes ordered by weight, heaviest
        first; a route the capacity dropped (or a token with fewer routes) has expert -1, slot 0, weight 0."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise MoEError(f"Routing.per_route: k={k!r} must be a positive integer (the routes per token)")
        per_token = torch.bincount(self.tokens, minlength=self.num_tokens)
        if self.tokens.numel() and int(per_token.max()) > k:
            raise MoEError(f"Routing.per_route: a token has {int(per_token.max())} routes, more than k={k}")
        # Heaviest first within a token: sort by weight, then (stably) by token.
        order = torch.argsort(self.weights.detach(), descending=True, stable=True)
        order = order[torch.argsort(self.tokens[order], stable=True)]
        tokens = self.tokens[order]
        starts = torch.cumsum(per_token, dim=0) - per_token
        rank = torch.arange(tokens.numel(), device=tokens.device) - starts[tokens]
        experts = torch.full((k, self.num_tokens), -1, dtype=torch.int32, device=tokens.device)
        slots = torch.zeros((k, self.num_tokens), dtype=torch.int32, device=tokens.device)
        experts[rank, tokens] = self.experts[order].to(torch.int32)
        slots[rank, tokens] = self.slots[order].to(torch.int32)
        weights = self.weights.new_zeros(k, self.num_tokens).index_put((rank, tokens), self.weights[order])
        return experts, slots, weights

    def deepspeed_sparse_outputs(self, k: int):
        """DeepSpeed's gating results with sparse_routes=True: (l_aux, capacity, num_experts, experts [k, S],
        slots [k, S], weights [k, S], exp_counts); see per_route."""
        experts, slots, weights = self.per_route(k)
        return self.l_aux, self.capacity, self.num_experts, experts, slots, weights, self.exp_counts


# ------------------------------------------------------------------------- routes as k rows of S
def route_slots(experts: torch.Tensor, slots: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Each route's place in the flat [num_experts * capacity] expert buffer (expert * capacity + slot); a
    dropped route (expert -1) gets the one place past the end, num_experts * capacity."""
    flat = experts.long() * capacity + slots.long()
    return torch.where(experts >= 0, flat, torch.full_like(flat, num_experts * capacity))


def encode_routes(tokens: torch.Tensor, places: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """The experts' input buffer [num_experts, capacity, model] from tokens [S, model] and each route's place
    (route_slots); a slot no route fills is zero. One gather: each place is read from the token routed to it."""
    num_tokens, model = tokens.shape
    end = num_experts * capacity
    token_of_place = torch.full((end + 1,), num_tokens, dtype=torch.long, device=tokens.device)
    token_ids = torch.arange(num_tokens, device=tokens.device).expand_as(places)
    token_of_place.scatter_(0, places.reshape(-1), token_ids.reshape(-1))
    padded = torch.cat([tokens, tokens.new_zeros(1, model)])
    return padded[token_of_place[:end]].view(num_experts, capacity, model)


def decode_routes(expert_output: torch.Tensor, places: torch.Tensor, weights: torch.Tensor,
                  num_tokens: int) -> torch.Tensor:
    """Each token's output [S, model]: the sum over its routes of the expert output at the route's place
    (expert_output is [num_experts * capacity, model]) times the route's weight; summed in the weights'
    dtype (float32 from the gates), returned in the experts' dtype."""
    model = expert_output.shape[-1]
    padded = torch.cat([expert_output, expert_output.new_zeros(1, model)])
    gathered = padded[places.reshape(-1)].view(places.shape[0], num_tokens, model)
    return (gathered * weights.unsqueeze(-1)).sum(dim=0).to(expert_output.dtype)


def _no_drop_capacity(exp_counts: torch.Tensor, reduce_max_load: MaxLoad | None) -> int:
    local = int(exp_counts.max().item()) if exp_counts.numel() else 0
    return reduce_max_load(local) if reduce_max_load is not None else local


def _keep_by_priority(routed: torch.Tensor, priority: torch.Tensor, capacity: int) -> torch.Tensor:
    """Of the routed [S, E] entries, each expert's `capacity` highest priorities (ties: earlier token)."""
    if capacity >= routed.shape[0]:
        return routed
    ranked = torch.where(routed, priority, torch.full_like(priority, -1.0))  # unrouted tokens never win
    order = torch.sort(ranked, dim=0, descending=True, stable=True).indices[:capacity]
    chosen = torch.zeros_like(routed).scatter_(0, order, True)
    return routed & chosen


def _sequence_slots(kept: torch.Tensor) -> torch.Tensor:
    """Each kept route's slot: how many kept routes of its expert come before it in sequence order."""
    return torch.cumsum(kept.long(), dim=0) - 1


def _check_logits(logits: torch.Tensor, name: str) -> None:
    if not torch.is_tensor(logits) or logits.dim() != 2:
        shape = tuple(logits.shape) if torch.is_tensor(logits) else type(logits).__name__
        raise MoEError(f"{name}: logits must be a [tokens, experts] tensor, got {shape}")


# ------------------------------------------------------------------------------------------- top-1
def route_top1(logits: torch.Tensor, capacity_factor: float, min_capacity: int, used_token: torch.Tensor | None = None,
               noisy_gate_policy: str | None = None, drop_tokens: bool = True, use_rts: bool = True, *,
               generator: torch.Generator | None = None, reduce_max_load: MaxLoad | None = None) -> Routing:
    """Each token to its most probable expert (with noisy_gate_policy "RSample": the argmax of the
    logits plus Gumbel noise), weighted by that expert's raw gate probability. `used_token` (one
    value per token) leaves the tokens where it is 0 unrouted."""
    _check_logits(logits, "top1gating")
    num_tokens, num_experts = logits.shape
    if num_tokens < min_capacity:
        raise MoEError(f"top1gating: {num_tokens} tokens is fewer than min_capacity={min_capacity}; DeepSpeed's "
                       f"top-1 gate needs tokens >= min_capacity: set min_capacity to at most {num_tokens} or give "
                       f"larger batches")
    gates = F.softmax(logits, dim=1)
    capacity = expert_capacity(num_tokens, num_experts, capacity_factor, min_capacity)
    if noisy_gate_policy == "RSample":
        choice = (logits + gumbel_rsample(logits.shape, logits, generator)).argmax(dim=1)
    else:
        choice = gates.argmax(dim=1)
    mask = F.one_hot(choice, num_classes=num_experts)
    if used_token is not None:
        mask = mask * (used_token.reshape(-1, 1) != 0).to(mask.dtype)
    exp_counts = mask.sum(dim=0).detach()
    if not drop_tokens:
        capacity = min(_no_drop_capacity(exp_counts, reduce_max_load), num_tokens)
    l_aux = torch.sum(gates.mean(dim=0) * mask.float().mean(dim=0)) * num_experts
    routed = mask.bool()
    if use_rts:
        kept = _keep_by_priority(routed, uniform(mask.shape, gates, generator), capacity)
    else:
        kept = routed & (_sequence_slots(routed) < capacity)
    return Routing.from_masks(kept, _sequence_slots(kept), gates, capacity, l_aux, exp_counts)


def top1gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, used_token: torch.Tensor | None = None,
               noisy_gate_policy: str | None = None, drop_tokens: bool = True, use_rts: bool = True, *,
               generator: torch.Generator | None = None, reduce_max_load: MaxLoad | None = None):
    """DeepSpeed's top1gating: (l_aux, combine_weights, dispatch_mask, exp_counts); see route_top1."""
    return route_top1(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy, drop_tokens, use_rts,
                      generator=generator, reduce_max_load=reduce_max_load).deepspeed_outputs()


# ------------------------------------------------------------------------------------------- top-2
def route_top2(logits: torch.Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool = True, *,
               top2_2nd_expert_sampling: bool = True, generator: torch.Generator | None = None,
               reduce_max_load: MaxLoad | None = None) -> Routing:
    """The most probable expert, and a second one: the next most probable, or with
    top2_2nd_expert_sampling the argmax of the other experts' logits plus Gumbel noise. The two
    weights are renormalised over the routes that survive the capacity (a lone survivor weighs 1)."""
    _check_logits(logits, "top2gating")
    num_tokens, num_experts = logits.shape
    if num_experts < 2:
        raise MoEError(f"top2gating needs at least 2 experts, got {num_experts}")
    gates = F.softmax(logits, dim=1)
    first = F.one_hot(gates.argmax(dim=1), num_classes=num_experts)
    scores = logits + gumbel_rsample(logits.shape, logits, generator) if top2_2nd_expert_sampling else logits
    second = F.one_hot(scores.masked_fill(first.bool(), float("-inf")).argmax(dim=1), num_classes=num_experts)
    slots_first = _sequence_slots(first)
    # Second choices queue behind every first choice of their expert (dropped ones included).
    slots_second = _sequence_slots(second) + first.sum(dim=0, keepdim=True)
    l_aux = torch.mean(gates.mean(dim=0) * first.float().mean(dim=0)) * num_experts * num_experts
    exp_counts = (first + second).sum(dim=0).detach()
    if drop_tokens:
        capacity = expert_capacity(num_tokens, num_experts, capacity_factor * 2, min_capacity)
        first = first * (slots_first < capacity)
        second = second * (slots_second < capacity)
    else:
        capacity = _no_drop_capacity(exp_counts, reduce_max_load)
    gate_first = (gates * first).sum(dim=1)
    gate_second = (gates * second).sum(dim=1)
    denominator = torch.clamp(gate_first + gate_second, min=torch.finfo(gates.dtype).eps)
    weights = (gate_first / denominator).unsqueeze(1) * first + (gate_second / denominator).unsqueeze(1) * second
    kept = (first + second).bool()
    locations = slots_first * first + slots_second * second
    return Routing.from_masks(kept, locations, weights, capacity, l_aux, exp_counts)


def top2gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool = True, *,
               top2_2nd_expert_sampling: bool = True, generator: torch.Generator | None = None,
               reduce_max_load: MaxLoad | None = None):
    """DeepSpeed's top2gating: (l_aux, combine_weights, dispatch_mask, exp_counts); see route_top2."""
    return route_top2(logits, capacity_factor, min_capacity, drop_tokens,
                      top2_2nd_expert_sampling=top2_2nd_expert_sampling, generator=generator,
                      reduce_max_load=reduce_max_load).deepspeed_outputs()


# ------------------------------------------------------------------------------------------- top-k
DROP_POLICIES = ("probs", "position")


def route_topk(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
               *, drop_policy: str = "probs", reduce_max_load: MaxLoad | None = None) -> Routing:
    """The k most probable experts of each token, weights renormalised over the surviving routes."""
    _check_logits(logits, "topkgating")
    num_tokens, num_experts = logits.shape
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= num_experts:
        raise MoEError(f"topkgating: k={k!r} must be an integer from 1 to the number of experts ({num_experts})")
    if drop_policy not in DROP_POLICIES:
        raise MoEError(f"topkgating: drop_policy={drop_policy!r} must be one of {', '.join(DROP_POLICIES)}")
    gates = F.softmax(logits, dim=1)
    top_gates, top_experts = torch.topk(gates, k=k, dim=1)
    routed = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_experts, True)
    exp_counts = routed.sum(dim=0).detach()
    l_aux = torch.mean(gates.mean(dim=0) * routed.float().mean(dim=0)) * num_experts * num_experts / k
    if not drop_tokens:
        capacity = _no_drop_capacity(exp_counts, reduce_max_load)
        kept = routed
    else:
        capacity = expert_capacity(num_tokens, num_experts, capacity_factor * k, min_capacity)
        if drop_policy == "probs":
            priority = torch.zeros_like(gates).scatter(1, top_experts, top_gates.detach())
            kept = _keep_by_priority(routed, priority, capacity)
        else:
            kept = routed & (_sequence_slots(routed) < capacity)
    masked = gates * kept
    weights = masked / torch.clamp(masked.sum(dim=-1, keepdim=True), min=torch.finfo(gates.dtype).eps)
    return Routing.from_masks(kept, _sequence_slots(kept), weights, capacity, l_aux, exp_counts)


def topkgating(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
               *, drop_policy: str = "probs", reduce_max_load: MaxLoad | None = None):
    """DeepSpeed's topkgating: (l_aux, combine_weights, dispatch_mask, exp_counts); see route_topk."""
    return route_topk(logits, k, capacity_factor, min_capacity, drop_tokens, drop_policy=drop_policy,
                      reduce_max_load=reduce_max_load).deepspeed_outputs()
