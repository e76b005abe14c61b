"""DeepSpeed's `deepspeed.moe.sharded_moe`: the gate module (TopKGate), the layer that routes tokens
through experts over the expert-parallel group (MOELayer), and the gating functions.

Both modules take their process group after construction (`_set_ep_group`), as DeepSpeed's do; they
keep no global state.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import dscomm

from .capacity import check_gate_settings, expert_capacity
from .checks import non_finite_message
from .dispatch import DISPATCH_MODES, choose_dispatch, dense_moe, sparse_moe
from .errors import MoEError
from .experts import Experts
from .gating import Routing, route_top1, route_top2, route_topk, top1gating, top2gating, topkgating
from .noise import gumbel_rsample, multiplicative_jitter

__all__ = ["MOELayer", "TopKGate", "gumbel_rsample", "multiplicative_jitter", "top1gating", "top2gating",
           "topkgating"]


class GateLinear(nn.Linear):
    """The gate's projection, in float32 whatever the model's dtype (as DeepSpeed's gate computes). Called as a
    module, so whatever hooks a module's forward sees it (ZeRO stage 3 gathers its weight there)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input.float(), self.weight.float())


class TopKGate(nn.Module):
    """The router: a bias-free linear layer to one logit per expert, then top-1, top-2 or top-k gating
    in float32. forward() returns DeepSpeed's (l_aux, combine_weights, dispatch_mask, exp_counts);
    route() the compact Routing the layer dispatches with. `generator`: where random draws come from
    (None: torch's default generator)."""

    wg: nn.Linear

    def __init__(self, model_dim: int, num_experts: int, k: int = 1, capacity_factor: float = 1.0,
                 eval_capacity_factor: float = 1.0, min_capacity: int = 8, noisy_gate_policy: str | None = None,
                 drop_tokens: bool = True, use_rts: bool = True, ep_group: Any = None,
                 top2_2nd_expert_sampling: bool = True, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_gate_settings(num_experts, k, capacity_factor, eval_capacity_factor, min_capacity, noisy_gate_policy)
        if noisy_gate_policy == "RSample" and k > 1:
            warnings.warn(f"noisy_gate_policy='RSample' applies to top-1 gates only; this gate is top-{k} and "
                          f"routes without it (as DeepSpeed's does)", stacklevel=3)
        self.wg = GateLinear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.num_experts = num_experts
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = None if noisy_gate_policy == "None" else noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.generator = generator
        self.layer_name: str | None = None  # the model's name for the layer (dsmoe.moe_layers sets it), for errors

    def _set_ep_group(self, ep_group: Any) -> None:
        self.ep_group = ep_group

    def current_capacity_factor(self) -> float:
        return self.capacity_factor if self.training else self.eval_capacity_factor

    def nominal_capacity(self, num_tokens: int) -> int:
        """The capacity with token dropping (what the dense buffers are sized by)."""
        return expert_capacity(num_tokens, self.num_experts, self.current_capacity_factor() * self.k,
                               self.min_capacity)

    def _reduce_max_load(self, local: int) -> int:
        load = torch.tensor([local], dtype=torch.int64, device=self.wg.weight.device)
        dscomm.all_reduce(load, op=dscomm.ReduceOp.MAX, group=self.ep_group, log_name="moe_capacity")
        return int(load.item())

    def route(self, input: torch.Tensor, used_token: torch.Tensor | None = None, *,
              global_capacity: bool = True) -> Routing:
        """The routing of `input` ([tokens, model]). global_capacity=False: with drop_tokens=False, size
        the capacity by this rank's load only (the sparse dispatch needs no common buffer shape)."""
        features = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            features = multiplicative_jitter(features, self.generator)
        logits = self.wg(features)
        # Read only after the routing below, which waits for the device anyway (its nonzero): no extra sync.
        finite = torch.isfinite(logits).all()
        grouped = self.ep_group is not None and dist.get_world_size(self.ep_group) > 1
        reduce = self._reduce_max_load if (global_capacity and grouped and not self.drop_tokens) else None
        factor = self.current_capacity_factor()
        if self.k == 1:
            routing = route_top1(logits, factor, self.min_capacity, used_token,
                                 self.noisy_gate_policy if self.training else None, self.drop_tokens, self.use_rts,
                                 generator=self.generator, reduce_max_load=reduce)
        elif self.k == 2:
            routing = route_top2(logits, factor, self.min_capacity, self.drop_tokens,
                                 top2_2nd_expert_sampling=self.top2_2nd_expert_sampling, generator=self.generator,
                                 reduce_max_load=reduce)
        else:
            routing = route_topk(logits, self.k, factor, self.min_capacity, self.drop_tokens, reduce_max_load=reduce)
        if not bool(finite):
            raise MoEError(non_finite_message(self.layer_name, input, self.wg.weight, logits))
        return routing

    def forward(self, input: torch.Tensor, used_token: torch.Tensor | None = None):
        return self.route(input, used_token).deepspeed_outputs()


class MOELayer(nn.Module):
    """Routes tokens through `experts` (this rank's `num_local_experts`) over the expert-parallel group
    of `ep_size` ranks. forward(hidden, used_token=None) returns the output and keeps `l_aux` and
    `exp_counts` of the call. `dispatch`: "dense" (DeepSpeed's einsum), "sparse" (index-based, variable
    all-to-all) or "auto" (see dispatch.choose_dispatch)."""

    def __init__(self, gate: TopKGate, experts: Experts, ep_group_name: str, ep_size: int, num_local_experts: int,
                 use_tutel: bool = False, *, dispatch: str = "auto") -> None:
        super().__init__()
        if dispatch not in DISPATCH_MODES:
            raise MoEError(f"MOELayer: dispatch={dispatch!r} must be one of {', '.join(DISPATCH_MODES)}")
        self.gate = gate
        self.experts = experts
        self.ep_group: Any = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.dispatch = dispatch
        self.l_aux: torch.Tensor | None = None
        self.exp_counts: torch.Tensor | None = None
        self.last_dispatch: str | None = None  # which path the last forward took

    def _set_ep_group(self, ep_group: Any) -> None:
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def forward(self, *input: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden = input[0]
        used_token = input[1] if len(input) > 1 else kwargs.get("used_token")
        if self.ep_size > 1 and self.ep_group is None:
            raise MoEError(f"MoE layer with ep_size {self.ep_size} has no expert-parallel group yet: call "
                           f"set_deepspeed_parallelism() (dstrain.initialize does) or set_expert_groups(...) first")
        model_dim = hidden.shape[-1]
        tokens = hidden.reshape(-1, model_dim)
        mode = choose_dispatch(self.dispatch, tokens.shape[0], self.gate.num_experts,
                               self.gate.nominal_capacity(tokens.shape[0]), self.ep_size, tokens.device)
        routing = self.gate.route(tokens, used_token, global_capacity=mode == "dense")
        if mode == "dense":
            out = dense_moe(tokens, routing, self.experts, self.ep_group, self.ep_size)
        else:
            out = sparse_moe(tokens, routing, self.experts, self.ep_group, self.ep_size)
        self.l_aux, self.exp_counts, self.last_dispatch = routing.l_aux, routing.exp_counts, mode
        return out.reshape(hidden.shape)
