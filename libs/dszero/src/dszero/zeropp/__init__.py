"""ZeRO++ for stage 3: hierarchical partitioning (hpZ), quantized weights (qwZ), quantized gradients (qgZ).

The config's keys turn each on (`zero_hpz_partition_size` > 1, `zero_quantized_weights`,
`zero_quantized_gradients`); `ZeroPPSettings` (ZeroOptimizer's `zeropp=` argument) says how they
quantize. `attach` hands stage 3 its routes (routes.py); nodes.py says which ranks share a node.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..errors import ZeroConfigError
from .nodes import NodeGroups, node_groups, ranks_per_node
from .routes import ZeroPlusPlusRoutes, ZeroPPSettings

__all__ = ["NodeGroups", "ZeroPPSettings", "ZeroPlusPlusRoutes", "attach", "enabled_keys", "logged_bytes"]


def enabled_keys(config: Any) -> list[str]:
    """The ZeRO++ keys a ZeroConfig turns on, by name."""
    keys = []
    if config.zero_hpz_partition_size > 1:
        keys.append(f"zero_hpz_partition_size = {config.zero_hpz_partition_size}")
    keys += [key for key in ("zero_quantized_weights", "zero_quantized_gradients") if getattr(config, key)]
    return keys


def attach(zero: Any, settings: ZeroPPSettings | None) -> ZeroPlusPlusRoutes | None:
    """Give a ZeroOptimizer's stage 3 the ZeRO++ routes its config asks for (None when it asks for none)."""
    config = zero.config
    keys = enabled_keys(config)
    if not keys:
        return None
    if zero.stage != 3:
        raise ZeroConfigError(f"zero_optimization: {', '.join(keys)} are ZeRO++, which partitions parameters: it needs "
                              f"stage 3 (stage is {zero.stage}); turn them off or use stage 3")
    if config.zero_quantized_gradients and zero.communication_dtype not in (None, zero.precision.torch_dtype):
        raise ZeroConfigError(f"zero_optimization.zero_quantized_gradients sends gradients as int4 blocks, so "
                              f"communication_data_type ({zero.communication_dtype}) would have no effect; leave "
                              f"communication_data_type out or turn zero_quantized_gradients off")
    group = zero.process_group
    per_node = ranks_per_node(group, config.zero_hpz_partition_size)
    if dist.get_world_size(group) == 1:
        return None  # nothing goes over a wire
    routes = ZeroPlusPlusRoutes(node_groups(group, per_node), settings or ZeroPPSettings(),
                                quantized_weights=config.zero_quantized_weights,
                                quantized_gradients=config.zero_quantized_gradients,
                                hpz=config.zero_hpz_partition_size > 1)
    stage3 = zero.reducer
    stage3.routes = routes
    for unit in stage3.units:
        # Persistent units are gathered once per step, exactly; units over a process group of their own
        # (experts over their expert-data group) travel plainly: the routes' node groups are the data group's.
        if not unit.persistent and unit.group is group:
            unit.routes = routes
    return routes


def logged_bytes(comms_log: dict[str, dict[int, dict[str, Any]]]) -> dict[str, int]:
    """{log name: bytes} from dscomm.get_comms_log(): every message's size times its count."""
    return {name: sum(size * entry["count"] for size, entry in sizes.items()) for name, sizes in comms_log.items()}
