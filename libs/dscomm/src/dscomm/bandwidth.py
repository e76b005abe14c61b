"""Message sizes and bandwidths by the nccl-tests conventions (pure arithmetic, no torch).

algbw = bytes / time. busbw scales algbw by how much each link must carry, so it can be compared
with the hardware's bandwidth whatever the collective and group size n.
"""

from __future__ import annotations

_REDUCE_LIKE = {"all_reduce"}
_GATHER_LIKE = {"all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "all_to_all", "all_to_all_single"}


def bus_factor(op: str, group_size: int) -> float:
    """busbw / algbw for `op` over `group_size` ranks."""
    n = group_size
    if n <= 1:
        return 0.0 if op in _REDUCE_LIKE | _GATHER_LIKE else 1.0
    if op in _REDUCE_LIKE:
        return 2 * (n - 1) / n
    if op in _GATHER_LIKE:
        return (n - 1) / n
    return 1.0  # broadcast, reduce, point-to-point


def bandwidths(op: str, nbytes: int, latency_ms: float, group_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second)."""
    if latency_ms <= 0:
        return 0.0, 0.0
    algbw = nbytes / (latency_ms / 1e3) / 1e9
    return algbw, algbw * bus_factor(op, group_size)


def size_str(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.2f} {unit}"
    return f"{nbytes} B"
