"""One optimizer parameter group, flattened: the model's parameters become views of one buffer.

The group owns the model-dtype flat buffer (every rank holds it whole at stages 0-2), this rank's
master shard (a view of that buffer when the master dtype equals the model dtype, so fp32
training keeps no second copy) and the gradient storage of the stage.
"""

from __future__ import annotations

from typing import Any

import torch

from .layout import GroupLayout
from .offload.pinned import host_copy


class FlatGroup:
    """`group` is the process group its gradients are reduced over (and, at stages 1-2, partitioned over);
    `average_over` what a summed gradient is divided by (None: the group's size); `norm_replicas` how
    many ranks of the norm group hold identical copies of these gradients besides the group itself."""

    def __init__(self, params: list[torch.nn.Parameter], names: list[str], layout: GroupLayout, shard_rank: int,
                 master_dtype: torch.dtype, offload: bool = False, pin_memory: bool = False, *, group: Any = None,
                 average_over: int | None = None, norm_replicas: int = 1):
        self.params = params
        self.names = names
        self.layout = layout
        self.shard_rank = shard_rank
        self.group = group
        self.average_over = average_over
        self.norm_replicas = norm_replicas
        self.dtype = params[0].dtype
        device = params[0].device
        self.model_flat = torch.zeros(layout.padded_numel, dtype=self.dtype, device=device)
        for param, slot in zip(params, layout.slots):
            view = self.model_flat[slot.offset:slot.end].view(slot.shape)
            view.copy_(param.data)
            param.data = view  # the module now reads its weights from the flat buffer
        lo, hi = layout.shard_range(shard_rank)
        own = self.model_flat[lo:hi]
        if master_dtype == self.dtype and not offload:
            self.master = own  # shares memory: the optimizer updates the model's own shard
            self.separate_master = False
        else:
            # Offloaded (or higher-precision) master weights live in their own CPU buffer.
            if offload:
                self.master = host_copy(own, master_dtype, pin_memory, "zero_optimization.offload_optimizer")
            else:
                self.master = own.to(dtype=master_dtype, copy=True)
            self.separate_master = True
        self.master_param = torch.nn.Parameter(self.master, requires_grad=False)

    @property
    def shard_numel(self) -> int:
        return self.layout.shard_numel

    def shard_slice(self) -> slice:
        lo, hi = self.layout.shard_range(self.shard_rank)
        return slice(lo, hi)

    def model_shard(self) -> torch.Tensor:
        return self.model_flat[self.shard_slice()]

    def master_to_model(self) -> None:
        """Copy this rank's updated master shard into its slice of the model buffer."""
        if self.separate_master:
            self.model_shard().copy_(self.master)

    def param_index(self) -> dict[int, int]:
        return {id(p): i for i, p in enumerate(self.params)}

