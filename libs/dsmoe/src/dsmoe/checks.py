"""What an MoE layer says when NaN or inf reach its router: the layer, where the values came from, and what to do.

The check itself is one reduction over the router's logits, read when the layer waits for the device
anyway (the gate's routing, AutoEP's split sizes); this message is built only on that failure.
"""

from __future__ import annotations

import torch


def _count(tensor: torch.Tensor) -> int:
    return int((~torch.isfinite(tensor.detach())).sum())


def non_finite_message(layer_name: str | None, hidden: torch.Tensor, router_weight: torch.Tensor | None,
                       logits: torch.Tensor, ranks: list[int] | None = None) -> str:
    """The error of a gate whose logits hold NaN or inf: here, or (`ranks`) on those ranks of its
    expert-parallel group, which compared their checks."""
    where = f"MoE layer {layer_name!r}" if layer_name else "an MoE layer (unnamed: dsmoe.moe_layers(model) names them)"
    bad_logits = _count(logits)
    if bad_logits:
        causes = []
        bad_inputs = _count(hidden)
        if bad_inputs:
            causes.append(f"{bad_inputs} of the {hidden.numel()} input values")
        bad_weights = _count(router_weight) if router_weight is not None else 0
        if bad_weights:
            causes.append(f"{bad_weights} of the router's {router_weight.numel()} weights")
        source = " and ".join(causes) if causes else "the router's product overflowed"
        what = f"{bad_logits} of its {logits.numel()} router logits are NaN or inf (from {source})"
    else:
        what = "the router's logits held NaN or inf"
    if ranks:
        what += f" on rank(s) {ranks} of its expert-parallel group"
    return (f"{where}: {what}; routing them would turn the loss into NaN. Look for what overflows before this "
            f"layer (lower the learning rate, clip gradients, or train in bf16 / fp32)")
