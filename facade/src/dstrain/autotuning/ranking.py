"""Which measurement is better: the metric's direction, and the experiments ranked best first.

latency is milliseconds per optimizer step (lower is better); throughput is samples per second and
flops is floating-point operations per second per device (higher is better). A failed experiment has
no value and ranks below every measured one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

METRICS = ("latency", "throughput", "flops")
UNITS = {"latency": "ms/step", "throughput": "samples/s", "flops": "FLOPS/device"}


def check_metric(metric: str) -> str:
    """The metric's canonical name ("FLOPS" is the reference's spelling of flops)."""
    name = metric.lower() if isinstance(metric, str) else metric
    if name not in METRICS:
        raise ValueError(f"autotuning.metric = {metric!r}: must be one of {', '.join(METRICS)}")
    return name


def lower_is_better(metric: str) -> bool:
    return check_metric(metric) == "latency"


def score(metric: str, value: float | None) -> float:
    """A number where higher is better whatever the metric (1/latency for latency); 0 for no value."""
    if value is None or value <= 0:
        return 0.0
    return 1.0 / value if lower_is_better(metric) else float(value)


def better(metric: str, value: float | None, than: float | None) -> bool:
    """Whether `value` beats `than` (a measured value beats None; None beats nothing)."""
    if value is None:
        return False
    if than is None:
        return True
    return value < than if lower_is_better(metric) else value > than


def ranked(items: Iterable[T], metric: str, value: Callable[[T], float | None],
           name: Callable[[T], str] = str) -> list[T]:
    """The items with a value, best first; ties keep the order of their names (stable, reproducible)."""
    measured = [item for item in items if value(item) is not None]
    sign = 1.0 if lower_is_better(metric) else -1.0
    return sorted(measured, key=lambda item: (sign * value(item), name(item)))
