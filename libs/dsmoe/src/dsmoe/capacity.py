"""How many tokens each expert takes per forward: plain arithmetic, no torch.

DeepSpeed's rule: capacity = ceil(tokens / experts x capacity_factor), where the factor is the
configured one times k for a top-k gate, and never below `min_capacity`. Without token dropping the
capacity is the busiest expert's load instead (the largest over the expert-parallel group, so every
rank's buffers have the same shape).
"""

from __future__ import annotations

import math
import struct

from .errors import MoEError

# A factor of num_experts already gives every expert a slot for every token; far beyond it the slot count
# overflows float32 (inf: OverflowError in ceil) or int64 (1e30: the buffers' shape), so it is refused.
MAX_CAPACITY_FACTOR = 1e4


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def expert_capacity(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert: ceil(num_tokens / num_experts * capacity_factor), at least min_capacity.

    The product is rounded to float32 before the ceiling, as DeepSpeed's float32 tensor arithmetic
    does, so the two never differ by one (25 x 1.2 is 30 in float64 but just above 30 in float32: 31).
    """
    if num_experts < 1:
        raise MoEError(f"expert capacity needs at least one expert, got num_experts={num_experts}")
    if not 0 < capacity_factor <= MAX_CAPACITY_FACTOR * num_experts:  # top-k gates pass the factor times k
        raise MoEError(f"capacity_factor must be a positive number of at most {MAX_CAPACITY_FACTOR:g} per expert "
                       f"chosen, got {capacity_factor}")
    # Two float32 values multiply exactly in float64; rounding that to float32 is float32's product.
    try:
        product = _float32(_float32(num_tokens / num_experts) * _float32(capacity_factor))
    except OverflowError:
        product = math.inf
    if not math.isfinite(product):
        raise MoEError(f"expert capacity for {num_tokens} tokens over {num_experts} experts at capacity_factor "
                       f"{capacity_factor} does not fit in float32; lower capacity_factor")
    return max(math.ceil(product), int(min_capacity))


def check_gate_settings(num_experts: int, k: int, capacity_factor: float, eval_capacity_factor: float,
                        min_capacity: int, noisy_gate_policy: str | None) -> None:
    """Refuse gate settings that cannot route, each with what would be valid."""
    problems = []
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
        problems.append(f"num_experts={num_experts!r} must be a positive integer")
    elif not isinstance(k, int) or isinstance(k, bool) or k < 1:
        problems.append(f"k={k!r} must be a positive integer")
    elif k > num_experts:
        problems.append(f"k={k} selects more experts per token than there are ({num_experts}); use k <= {num_experts}")
    for name, value in (("capacity_factor", capacity_factor), ("eval_capacity_factor", eval_capacity_factor)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= MAX_CAPACITY_FACTOR:
            problems.append(f"{name}={value!r} must be a finite positive number of at most {MAX_CAPACITY_FACTOR:g} "
                            f"(a factor of num_experts already gives every expert a slot for every token; "
                            f"drop_tokens=False never drops one)")
    if not isinstance(min_capacity, int) or isinstance(min_capacity, bool) or min_capacity < 0:
        problems.append(f"min_capacity={min_capacity!r} must be a non-negative integer")
    if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
        problems.append(f"noisy_gate_policy={noisy_gate_policy!r} must be None, 'None', 'Jitter' or 'RSample'")
    if problems:
        raise MoEError("MoE gate: " + "; ".join(problems))
