"""Where the stage boundaries fall: DeepSpeed's `partition_uniform` and `partition_balanced` (same names,
arguments and boundaries as `deepspeed.runtime.utils`), and the weights each partition method balances.

A partition of n items into k parts is the list of k + 1 boundaries [0, b1, ..., n]: part i holds
items parts[i] .. parts[i + 1] - 1. Plain Python apart from `layer_weights`, which may build layers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from .errors import PipelineError

METHODS = ("parameters", "uniform", "type:<regex>", "profile")


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Boundaries giving each part num_items // num_parts items, the first num_items % num_parts parts one
    more. With fewer items than parts, the first num_items parts hold one each and the rest none."""
    _check_count("num_items", num_items, 0)
    _check_count("num_parts", num_parts, 1)
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def prefix_sum_inc(weights: Sequence[float]) -> list[float]:
    """Inclusive prefix sums: element i is weights[0] + ... + weights[i] (DeepSpeed's name)."""
    sums: list[float] = []
    for value in weights:
        sums.append(value + (sums[-1] if sums else 0))
    return sums


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """Contiguous parts whose weight sums are as even as possible: the smallest spread between the heaviest
    and the lightest part (the linear partition problem, by dynamic programming in O(n^2 k)). Among equal
    spreads the last part starts as late as possible, as DeepSpeed's does, so the boundaries are its."""
    _check_count("num_parts", num_parts, 1)
    values = [float(w) for w in weights]
    n, k = len(values), num_parts
    if n <= k:
        return partition_uniform(n, k)
    prefix = [0.0, *prefix_sum_inc(values)]
    inf = math.inf
    # best[j][i]: (spread, heaviest, lightest, start of the last part) of the first i items in j parts.
    spread = [[inf] * (n + 1) for _ in range(k + 1)]
    heaviest = [[inf] * (n + 1) for _ in range(k + 1)]
    lightest = [[inf] * (n + 1) for _ in range(k + 1)]
    start = [[0] * (n + 1) for _ in range(k + 1)]
    spread[0][0], heaviest[0][0] = 0.0, 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, k) + 1):
            row_spread, row_heavy, row_light = spread[j], heaviest[j], lightest[j]
            prev_heavy, prev_light = heaviest[j - 1], lightest[j - 1]
            for cut in range(i):
                part = prefix[i] - prefix[cut]
                high = max(prev_heavy[cut], part)
                low = min(prev_light[cut], part)
                cost = high - low
                if row_spread[i] >= cost:  # ties move the cut later
                    row_spread[i], row_heavy[i], row_light[i], start[j][i] = cost, high, low, cut
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(start[j][bounds[-1]])
    return bounds[::-1]


def _check_count(name: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise PipelineError(f"{name} must be an int >= {least}, got {value!r}")


# ---------------------------------------------------------------------------------------------- methods
def layer_name(layer: Any) -> str | None:
    """The class name a `type:<regex>` method matches: a spec's type, a module's class, a function's name."""
    typename = getattr(layer, "typename", None)
    if isinstance(typename, type):
        return typename.__name__
    if hasattr(layer, "parameters") and hasattr(layer, "forward"):
        return type(layer).__name__
    return getattr(layer, "__name__", None)


def type_weights(layers: Sequence[Any], pattern: str) -> list[int]:
    """1 for each layer whose class name matches `pattern` (case-insensitive search), else 0."""
    try:
        regex = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise PipelineError(f"partition_method 'type:{pattern}': not a valid regular expression ({exc})") from None
    weights = [1 if (name := layer_name(layer)) is not None and regex.search(name) else 0 for layer in layers]
    if not any(weights):
        names = sorted({n for n in (layer_name(layer) for layer in layers) if n})
        raise PipelineError(f"partition_method 'type:{pattern}' matches no layer; the layers' class names are: "
                            f"{', '.join(names[:20]) or 'none'}")
    return weights


def partition_layers(layers: Sequence[Any], num_parts: int, method: str, *,
                     parameter_counts: Callable[[], list[int]],
                     profile_times: Callable[[], list[float]]) -> list[int]:
    """The boundaries of `num_parts` stages over `layers` by `method` (one of METHODS, case-insensitive).

    The two callables measure the layers only when their method is asked for (counting parameters may
    build every layer; profiling runs them)."""
    if not isinstance(method, str):
        raise PipelineError(f"partition_method must be a string, one of {', '.join(METHODS)}; got {method!r}")
    lowered = method.lower()
    if lowered == "uniform":
        return partition_uniform(len(layers), num_parts)
    if lowered == "parameters":
        return partition_balanced(parameter_counts(), num_parts)
    if lowered.startswith("type:"):
        return partition_balanced(type_weights(layers, method.split(":", 1)[1]), num_parts)
    if lowered == "profile":
        return partition_balanced(profile_times(), num_parts)
    raise PipelineError(f"partition_method {method!r} is not known; valid: {', '.join(METHODS)}")
