"""partition_method="profile": time each layer's forward and backward on a sample micro-batch.

Every rank builds each layer in turn (one at a time, freed after), feeds it the previous layer's
output and times forward + backward. Timings differ between ranks, and ranks must cut the same
boundaries, so the first rank's timings are broadcast to all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .errors import PipelineError
from .layers import LayerSpec

REPEATS = 3


def profile_layer_times(layers: Sequence[Any], sample_input: Any, method: str) -> list[float]:
    """Seconds per layer (the fastest of REPEATS forward + backward runs after one warm-up, which load on
    the machine only slows), the same list on every rank."""
    if sample_input is None:
        raise PipelineError(f"partition_method={method!r} times each layer on a sample micro-batch: pass "
                            f"PipelineModule(..., sample_input=<one micro-batch of the first stage's input>)")
    times = []
    inputs = sample_input
    built: dict[str, torch.nn.Module] = {}  # a tied key is built once, as the module will
    for spec in layers:
        layer = _instance(spec, built)
        seconds, inputs = _time_layer(layer, inputs)
        times.append(seconds)
    return _agreed(times)


def _instance(spec: Any, built: dict[str, torch.nn.Module]) -> Any:
    key = getattr(spec, "key", None)
    if key is not None:
        if key not in built:
            built[key] = spec.build()
        module = built[key]
        forward_fn = getattr(spec, "forward_fn", None)
        return module if forward_fn is None else (lambda x, m=module, f=forward_fn: f(m, x))
    return spec.build() if isinstance(spec, LayerSpec) else spec


def _time_layer(layer: Any, inputs: Any) -> tuple[float, Any]:
    runs = []
    output = None
    for attempt in range(REPEATS + 1):
        leaves = _fresh_leaves(inputs)
        start = time.perf_counter()
        output = layer(leaves)
        grads = [t for t in _tensors(output) if t.requires_grad]
        if grads:
            torch.autograd.backward(grads, [torch.ones_like(t) for t in grads])
        if attempt:  # the first run pays one-time costs (allocations, autograd set-up)
            runs.append(time.perf_counter() - start)
    return min(runs), _detached(output)


def _tensors(value: Any) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _fresh_leaves(value: Any) -> Any:
    if torch.is_tensor(value):
        leaf = value.detach()
        return leaf.requires_grad_(True) if leaf.is_floating_point() else leaf
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh_leaves(v) for v in value)
    return value


def _detached(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


def _agreed(times: list[float]) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return times
    shared = torch.tensor(times, dtype=torch.float64)
    dscomm.broadcast(shared, 0, log_name="pipe_profile")
    return shared.tolist()
