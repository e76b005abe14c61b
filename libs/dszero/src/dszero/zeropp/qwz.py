"""qwZ: a stage-3 all-gather that carries blockwise-quantized shards (int8 by default) instead of the weights.

Each rank quantizes its shard, the payloads are all-gathered (wire.gather_shards: one broadcast per
rank on gloo, the native all-gather elsewhere), and every rank dequantizes all of them, its own too,
so that every rank computes with the same weights. The shard itself (and the master weights) stay in
full precision: only the gathered compute copy is quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..quantize import QuantSpec, dequantize, quantize
from ..wire import gather_shards


class Pending:
    """An asynchronous gather and what must run once it has arrived (dequantizing, keeping a copy)."""

    def __init__(self, handles: Any, then: Callable[[], None]):
        self.handles = handles
        self.then = then

    def wait(self) -> None:
        if self.handles is not None:
            self.handles.wait()
            self.handles = None
            self.then()


def quantized_gather(full: torch.Tensor, shard: torch.Tensor, group: Any, spec: QuantSpec, *, async_op: bool,
                     log_name: str) -> Pending | None:
    """`full` = every rank's `shard` (in rank order), carried as quantized payloads and dequantized."""
    world = dist.get_world_size(group)
    size = shard.numel()
    mine = quantize(shard, spec).view(-1)
    payloads = torch.empty(world * mine.numel(), dtype=torch.uint8, device=shard.device)
    handles = gather_shards(payloads, mine, group, async_op=async_op, log_name=log_name)

    def unpack() -> None:
        dequantize(payloads.view(world, -1), size, spec, out=full[:world * size])

    if not async_op:
        unpack()
        return None
    return Pending(handles, unpack)
