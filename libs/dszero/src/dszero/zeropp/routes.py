"""The ZeRO++ routes of stage-3 units: which collective serves a compute gather and a gradient reduction.

Stage 3 asks `gather(unit, async_op)` for the gathers of forward and backward (and their prefetches),
and `reduce_scatter(unit, out, flat, average)` for each unit's gradients; exact gathers (persistent
units, GatheredParameters, checkpoints) never come here, so they see the full-precision weights.

- hpZ (`zero_hpz_partition_size` = h > 1): the first gather of a unit's weights (its forward, after a
  step or a load changed them) is over the whole data-parallel group (the primary partition); the
  rank then keeps its 1/h slice of the gathered buffer, in the model's dtype, as its part of the node's
  secondary partition. Every later gather of the same weights (backward, and forwards of further
  micro-steps) all-gathers that secondary partition within the node. The copy is dropped when the
  weights change (`weights_changed`), so a secondary gather never serves stale weights. It is taken
  from what the primary gather delivered, so forward and backward see the same values, quantized or not.
- qwZ (`zero_quantized_weights`): primary gathers carry int8 blocks (qwz.py); the secondary gather
  stays in the model's dtype: it does not leave the node, and it repeats the forward's values exactly.
- qgZ (`zero_quantized_gradients`): gradients are reduced by qgz.py's two quantized all-to-alls.

Which route a gather takes depends only on the sequence of gathers and steps, the same on every rank,
so every rank issues the same collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..quantize import QuantSpec
from ..wire import gather_shards, reduce_scatter
from .nodes import NodeGroups
from .qgz import Residuals, quantized_reduce_scatter
from .qwz import Pending, quantized_gather


@dataclass(frozen=True)
class ZeroPPSettings:
    """How ZeRO++ quantizes (which features are on comes from the config's keys).

    weights: qwZ's blocks (default int8, symmetric, 256 elements: 1.97x fewer bytes than 16-bit weights);
    gradients: qgZ's blocks (default int4, symmetric, 128 elements: 3.76x fewer than 16-bit gradients);
    error_feedback: carry qgZ's quantization error into the next reduction (see qgz.py; off by default).
    """

    weights: QuantSpec = QuantSpec(bits=8, block_size=256, symmetric=True)
    gradients: QuantSpec = QuantSpec(bits=4, block_size=128, symmetric=True)
    error_feedback: bool = False


class SecondaryCopy:
    """This rank's slice of a unit's node-local (secondary) partition, valid until the weights change."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device):
        self.tensor = torch.empty(numel, dtype=dtype, device=device)
        self.valid = False


class ZeroPlusPlusRoutes:
    def __init__(self, nodes: NodeGroups, settings: ZeroPPSettings, *, quantized_weights: bool,
                 quantized_gradients: bool, hpz: bool):
        self.nodes = nodes
        self.settings = settings
        self.quantized_weights = quantized_weights
        self.quantized_gradients = quantized_gradients
        self.hpz = hpz
        self.secondary: dict[int, SecondaryCopy] = {}
        self.residuals: dict[int, Residuals] = {}

    # ------------------------------------------------------------------ weights
    def gather(self, unit: Any, *, async_op: bool) -> Any:
        copy = self.secondary.get(id(unit)) if self.hpz else None
        if copy is not None and copy.valid:
            return gather_shards(unit.model_flat, copy.tensor, self.nodes.local_group, async_op=async_op,
                                 log_name="zeropp_hpz_gather")
        shard = unit.home.fetch()
        if self.quantized_weights:
            pending = quantized_gather(unit.model_flat, shard, unit.group, self.settings.weights, async_op=async_op,
                                       log_name="zeropp_qwz_gather")
        else:
            pending = gather_shards(unit.model_flat, shard, unit.group, async_op=async_op, log_name="zero3_gather")
        if not self.hpz:
            return pending
        if pending is None:
            self._keep_secondary(unit)
            return None
        return Pending(pending, lambda: self._keep_secondary(unit))

    def _keep_secondary(self, unit: Any) -> None:
        size = unit.layout.padded_numel // self.nodes.per_node
        copy = self.secondary.get(id(unit))
        if copy is None:
            copy = self.secondary[id(unit)] = SecondaryCopy(size, unit.model_flat.dtype, unit.model_flat.device)
        start = self.nodes.local * size
        copy.tensor.copy_(unit.model_flat[start:start + size])
        copy.valid = True

    def weights_changed(self, unit: Any) -> None:
        copy = self.secondary.get(id(unit))
        if copy is not None:
            copy.valid = False

    # ------------------------------------------------------------------ gradients
    def reduce_scatter(self, unit: Any, out: torch.Tensor, flat: torch.Tensor, *, average: bool) -> torch.Tensor:
        if not self.quantized_gradients:
            return reduce_scatter(out, flat, unit.group, average=average, log_name="zero3_reduce_scatter")
        residuals = None
        if self.settings.error_feedback:
            residuals = self.residuals.setdefault(id(unit), Residuals())
        return quantized_reduce_scatter(out, flat, self.nodes, self.settings.gradients, average=average,
                                        residuals=residuals)

    def buffer_bytes(self) -> int:
        """Secondary copies and error-feedback residuals held on this rank."""
        held = sum(c.tensor.numel() * c.tensor.element_size() for c in self.secondary.values())
        return held + sum(r.nbytes() for r in self.residuals.values())
