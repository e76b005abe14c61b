"""The dropless expert-parallel MoE block AutoEP puts in place of a Hugging Face one.

It keeps the block's own router and shared-expert modules under their own names (so the router's
output hooks transformers uses for `router_logits` and the aux loss still fire, and a DeepSeek-V3
correction bias stays where the model keeps it, parameter or buffer) and replaces the experts by
`LocalExperts`: the same weight names and layout, holding this rank's slice of the experts.

Forward: route in float32 -> permute token copies expert-major -> (ep > 1) one all-to-all of the
per-expert counts, one host sync for every split size, an exact-split all-to-all-v of the rows ->
the local experts' grouped MLP -> the way back -> combine weighted by the scores ("post") or with
the scores applied to the rows before the experts ("pre").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..all_to_all import all_to_all, exchange_counts
from ..checks import non_finite_message
from ..errors import MoEError
from .grouped import expert_mlp, grouped_mm_fits
from .replicated import enter_shares, sum_shares
from .routing import RoutingSpec, route


@dataclass(frozen=True)
class BlockNames:
    """Child attribute names of a MoE block and the weight names of its experts module."""

    router: str
    experts: str
    w1: str
    w2: str
    w3: str | None
    shared_experts: str | None = None
    shared_experts_gate: str | None = None
    correction_bias: str | None = None


class LocalExperts(nn.Module):
    """This rank's experts [first, first + count) of a layer of `num_global` experts, their weights
    stacked as the model stored them (names and layout unchanged)."""

    def __init__(self, weights: dict[str, torch.Tensor], first: int, num_global: int, in_out: bool,
                 act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.weight_names = tuple(weights)
        for name, tensor in weights.items():  # at autoep_size 1 the model's own parameters (optimizers keep them)
            self.register_parameter(name, tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor))
        self.first_expert = first
        self.num_local = next(iter(weights.values())).shape[0]
        self.num_global = num_global
        self.in_out = in_out
        self.act_fn = act

    def global_expert_ids(self) -> range:
        return range(self.first_expert, self.first_expert + self.num_local)

    def forward(self, rows: torch.Tensor, sizes: list[int], names: BlockNames, backend: str) -> torch.Tensor:
        """The MLP of each local expert over its rows (sizes[e] rows for local expert e, expert-major). A module
        call, so whatever hooks a module's forward (ZeRO stage 3 gathers and releases its weights) sees it."""
        w1, w2 = getattr(self, names.w1), getattr(self, names.w2)
        w3 = getattr(self, names.w3) if names.w3 is not None else None
        if backend == "grouped_mm" and not grouped_mm_fits(rows.dtype, [rows.shape[1], *w1.shape[1:], *w2.shape[1:]]):
            backend = "loop"  # cast since apply() (e.g. to bf16 by the engine) to a dtype whose rows are not 16-byte aligned
        return expert_mlp(rows, sizes, w1, w2, w3, self.in_out, self.act_fn, backend)


class AutoEPLayer(nn.Module):
    def __init__(self, block: nn.Module, names: BlockNames, spec: RoutingSpec, experts: LocalExperts,
                 ep_group: Any, ep_size: int, score_apply: str, combine_impl: str, backend: str,
                 replicated_tokens: bool = False) -> None:
        super().__init__()
        self.names = names
        self.spec = spec
        self.ep_group = ep_group
        self.ep_size = ep_size
        # Every rank of ep_group holds the same tokens (the tensor-parallel group): shares summed, no exchange.
        self.replicated_tokens = replicated_tokens
        self.score_apply = score_apply
        self.combine_impl = combine_impl
        self.backend = backend
        self.expert_data_group: Any = None  # set by the facade: where expert gradients are averaged
        self.jitter_noise = float(getattr(block, "jitter_noise", 0.0) or 0.0)  # Mixtral's router_jitter_noise
        self.layer_name: str | None = None  # the model's name for the layer (apply() sets it), for errors
        for child in (names.router, names.experts, names.shared_experts, names.shared_experts_gate):
            if child is not None and hasattr(self, child):
                raise MoEError(f"expert_parallel: child name {child!r} is an attribute of AutoEPLayer; rename the "
                               f"module (router_pattern, expert_pattern, shared_experts_pattern)")
        self.add_module(names.router, getattr(block, names.router))
        self.add_module(names.experts, experts)
        for child in (names.shared_experts, names.shared_experts_gate):
            if child is not None:
                self.add_module(child, getattr(block, child))

    @property
    def router_module(self) -> nn.Module:
        return getattr(self, self.names.router)

    @property
    def local_experts(self) -> LocalExperts:
        return getattr(self, self.names.experts)

    def extra_repr(self) -> str:
        return (f"experts={self.spec.num_experts}, top_k={self.spec.top_k}, ep_size={self.ep_size}, "
                f"backend={self.backend!r}, score_apply={self.score_apply!r}"
                f"{', tokens replicated over the group' if self.replicated_tokens else ''}")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        if self.training and self.jitter_noise > 0:  # as the HF block: the input scaled by U(1 - j, 1 + j)
            noise = torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
            hidden_states = hidden_states * noise
        x = hidden_states.reshape(-1, shape[-1])
        out = self.router_module(x)  # the model's router: its hooks record router_logits as before
        logits = out[0] if isinstance(out, tuple) else out
        bias = getattr(self.router_module, self.names.correction_bias) if self.names.correction_bias else None
        weights, indices = route(logits, self.spec, bias)
        # Read with the split sizes, the layer's one host sync: the check costs no wait of its own.
        finite = torch.isfinite(logits).all()
        y = self._routed(x, weights, indices, _Check(finite, self, x, logits))
        if self.names.shared_experts is not None:
            shared = getattr(self, self.names.shared_experts)(x)
            if self.names.shared_experts_gate is not None:
                shared = F.sigmoid(getattr(self, self.names.shared_experts_gate)(x)) * shared
            y = y + shared
        return y.view(shape)

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, check: _Check) -> torch.Tensor:
        if self.replicated_tokens and self.ep_size > 1:
            return self._shares(x, weights, indices, check)
        tokens, top_k = indices.shape
        flat = indices.reshape(-1)
        order = torch.argsort(flat, stable=True)  # token copies expert-major
        rows = x.index_select(0, order // top_k)
        if self.score_apply == "pre":
            rows = rows * weights.reshape(-1)[order].unsqueeze(1).to(rows.dtype)
        counts = torch.bincount(flat, minlength=self.spec.num_experts)
        if self.ep_size == 1:
            host = torch.cat([counts, check.finite.view(1).to(counts.dtype)]).tolist()
            check.verify([host[-1]])
            rows = self._experts(rows, host[:-1])
        else:
            rows = self._exchange_and_compute(rows, counts, check)
        per_copy = rows.index_select(0, _inverse(order)).view(tokens, top_k, -1)
        if self.score_apply == "pre":
            return per_copy.float().sum(dim=1).to(x.dtype)
        if self.combine_impl == "legacy_bmm":
            return torch.bmm(weights.unsqueeze(1), per_copy.float()).squeeze(1).to(x.dtype)
        return (per_copy.float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)

    def _experts(self, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        return self.local_experts(rows, sizes, self.names, self.backend)

    def _shares(self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, check: _Check) -> torch.Tensor:
        """Tokens replicated over the group (replicated.py): this rank's experts' share of every token's output,
        summed over the group."""
        tokens, top_k = indices.shape
        local = self.local_experts
        first, count = local.first_expert, local.num_local
        x, weights = enter_shares(x, self.ep_group), enter_shares(weights, self.ep_group)
        flat = indices.reshape(-1)
        order = torch.argsort(flat, stable=True)  # token copies expert-major
        counts = torch.bincount(flat, minlength=self.spec.num_experts)
        host = torch.cat([counts, check.finite.view(1).to(counts.dtype)]).tolist()  # the layer's one host sync
        check.verify([host[-1]])  # the logits are the same on every rank of the group
        start = sum(host[:first])
        mine = order[start:start + sum(host[first:first + count])]  # the copies routed to this rank's experts
        token_of = mine // top_k
        rows = x.index_select(0, token_of)
        scores = weights.reshape(-1).index_select(0, mine).unsqueeze(1)
        if self.score_apply == "pre":
            rows = rows * scores.to(rows.dtype)
        out = self._experts(rows, host[first:first + count]).float()
        if self.score_apply != "pre":
            out = out * scores
        share = out.new_zeros((tokens, out.shape[1])).index_add(0, token_of, out)
        return sum_shares(share, self.ep_group).to(x.dtype)

    def _exchange_and_compute(self, rows: torch.Tensor, counts: torch.Tensor, check: _Check) -> torch.Tensor:
        ranks, local = self.ep_size, self.local_experts.num_local
        # Each block of counts carries this rank's finite flag, so every rank learns whether any gate saw NaN.
        flagged = torch.cat([counts.view(ranks, local), check.finite.view(1, 1).to(counts.dtype).expand(ranks, 1)], 1)
        exchanged = exchange_counts(flagged.reshape(-1), self.ep_group).view(ranks, local + 1)
        received = exchanged[:, :local].reshape(-1)  # [source rank x local expert]
        host = torch.cat([counts, exchanged.reshape(-1)]).tolist()  # the layer's one host sync
        from_ranks = host[ranks * local:]
        check.verify(from_ranks[local::local + 1])
        recv_counts = [n for r in range(ranks) for n in from_ranks[r * (local + 1):r * (local + 1) + local]]
        send = [sum(host[r * local:(r + 1) * local]) for r in range(ranks)]
        recv = [sum(recv_counts[r * local:(r + 1) * local]) for r in range(ranks)]
        sizes = [sum(recv_counts[r * local + e] for r in range(ranks)) for e in range(local)]
        arrived = all_to_all(rows, self.ep_group, recv, send)
        # arrived rows are grouped by source rank, then expert: regroup expert-major for the GEMMs
        expert_of_row = torch.arange(ranks * local, device=rows.device).remainder(local).repeat_interleave(
            received, output_size=sum(recv))
        by_expert = torch.argsort(expert_of_row, stable=True)
        computed = self._experts(arrived.index_select(0, by_expert), sizes)
        return all_to_all(computed.index_select(0, _inverse(by_expert)), self.ep_group, send, recv)


class _Check:
    """The layer's finite-logits flag, checked where the layer reads its split sizes to the host."""

    def __init__(self, finite: torch.Tensor, layer: AutoEPLayer, hidden: torch.Tensor, logits: torch.Tensor):
        self.finite, self.layer, self.hidden, self.logits = finite, layer, hidden, logits

    def verify(self, flags: list[int]) -> None:
        """`flags`: 1 where a rank's logits were all finite, in expert-parallel rank order."""
        if all(flags):
            return
        ranks = [rank for rank, ok in enumerate(flags) if not ok] if len(flags) > 1 else None
        weight = getattr(self.layer.router_module, "weight", None)
        raise MoEError(non_finite_message(self.layer.layer_name, self.hidden,
                                          weight if torch.is_tensor(weight) else None, self.logits, ranks))


def _inverse(permutation: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes `permutation` (rows gathered by it go back to where they came from)."""
    inverse = torch.empty_like(permutation)
    inverse[permutation] = torch.arange(permutation.numel(), device=permutation.device)
    return inverse
