"""qgZ: a gradient reduce-scatter as two all-to-alls of blockwise-quantized gradients (int4 by default).

With W data ranks as `n` nodes of `h` (data rank r = node * h + local) and S elements per shard:
1. Within the node: for each node-mate j, this rank quantizes the shards that j reduces for the node
   (those of ranks node' * h + j, for every node': n * S elements), and one all-to-all over the node
   swaps them; each rank dequantizes what it got and sums it: its node's partial sums of n shards.
2. Across nodes: those n partial shards are quantized again, one per node, and an all-to-all over the
   ranks at the same place in every node brings each rank the partial sums of its own shard from every
   node; dequantized and summed, that is the whole sum, divided by W when averaging (what the plain
   reduce-scatter returns).
A node of one rank skips step 1, one node skips step 2. Sums run in float32. Bytes sent per rank:
payload(n * S) per node-mate and payload(S) per node, against S elements of the gradient's dtype per
rank for the plain reduce-scatter: int4 is 4x fewer bytes than 16-bit gradients in each step; step 2
adds the node's partial sums (1/h of the gradient) and is the only one that leaves the node.

Error feedback (optional): each step keeps what quantization lost (float32, per unit: n * S * h
elements for step 1 and n * S for step 2, the unit's whole gradient and 1/h of it) and adds it to the
next reduction's input before quantizing, so errors do not accumulate over steps: the sum of the
reduced gradients over k steps differs from the exact sum by one step's error, not k. It costs that
float32 memory on every rank (which ZeRO-3 otherwise does not hold), and is not checkpointed: a
resumed run starts it from zero.
"""

from __future__ import annotations

from typing import Any

import torch

import dscomm

from ..quantize import QuantSpec, dequantize, quantize
from .nodes import NodeGroups


class Residuals:
    """What quantization lost in each step of one unit's last reduction (error feedback)."""

    def __init__(self) -> None:
        self.within: torch.Tensor | None = None
        self.across: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.within, self.across) if t is not None)


def _send(values: torch.Tensor, spec: QuantSpec, residual: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
    """(payload rows of `values` + residual, the new residual or None)."""
    if residual is not None:
        values = values + residual
    payload = quantize(values, spec)
    if residual is None:
        return payload, None
    return payload, values - dequantize(payload, values.shape[1], spec)


def _swap(payload: torch.Tensor, group: Any, log_name: str) -> torch.Tensor:
    received = torch.empty_like(payload)
    dscomm.all_to_all_single(received.view(-1), payload.view(-1), group=group, log_name=log_name)
    return received


def _exchange_and_sum(rows: torch.Tensor, spec: QuantSpec, residuals: Residuals | None, step: str, group: Any,
                      log_name: str) -> torch.Tensor:
    """Quantize `rows` (one per peer of `group`, plus this step's residual under error feedback), swap them over
    the group and sum what arrives. `step` names the Residuals field ("within" or "across") this step keeps."""
    residual = None
    if residuals is not None:
        residual = getattr(residuals, step)
        if residual is None:
            residual = torch.zeros_like(rows)
    payload, lost = _send(rows, spec, residual)
    if residuals is not None:
        setattr(residuals, step, lost)
    return dequantize(_swap(payload, group, log_name), rows.shape[1], spec).sum(dim=0)


def quantized_reduce_scatter(out: torch.Tensor, flat: torch.Tensor, nodes: NodeGroups, spec: QuantSpec, *,
                             average: bool, residuals: Residuals | None = None) -> torch.Tensor:
    """This rank's shard of the sum (or mean) of `flat` over the data-parallel ranks, written to `out`."""
    size = out.numel()
    n, h = nodes.nodes, nodes.per_node
    grads = flat.view(n, h, size)
    if h > 1:
        # Row j: the shards node-mate j reduces for this node, every node's in node order.
        rows = grads.permute(1, 0, 2).reshape(h, n * size).float()
        partial = _exchange_and_sum(rows, spec, residuals, "within", nodes.local_group, "zeropp_qgz_within_node")
    else:
        partial = grads.reshape(n * size).float()
    if n > 1:
        total = _exchange_and_sum(partial.view(n, size), spec, residuals, "across", nodes.across_group,
                                  "zeropp_qgz_across_nodes")
    else:
        total = partial
    if average:
        total /= nodes.world
    return out.copy_(total)
