"""Which micro-batches can fit, before anything is launched: dszero's model-state estimators plus the
activation memory per sample measured by the first experiment.

model states (dszero.estimators, the ZeRO paper's count: 16-bit weights and gradients, 12 bytes of
Adam state per parameter, partitioned by stage) + activations * micro-batch must stay below the
device's memory with a margin. Stages 0 and 1 are counted the same way (dszero prints 2 and 3 only):
nothing partitioned at 0, the optimizer state at 1. A point above the estimate is never launched;
the largest one below it is then checked by a real experiment (the memory probe).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HEADROOM = 0.9  # of the device's memory: allocator fragmentation and buffers the count leaves out


@dataclass(frozen=True)
class ModelInfo:
    """What the first successful experiment measured (its metrics file)."""

    num_params: int
    largest_layer_params: int
    device_memory_bytes: int
    activation_bytes_per_sample: float  # 0 when it could not be measured

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> ModelInfo | None:
        try:
            micro = max(int(metrics["train_micro_batch_size_per_gpu"]), 1)
            activation = max(float(metrics.get("activation_memory_bytes") or 0.0), 0.0)
            return cls(int(metrics["num_params"]), int(metrics.get("largest_layer_params") or 0),
                       int(metrics["device_memory_bytes"]), activation / micro)
        except (KeyError, TypeError, ValueError):
            return None


def model_state_bytes(stage: int, num_params: int, largest_layer: int, data_parallel: int, *,
                      offload_optimizer: bool = False, offload_param: bool = False) -> int:
    """Per-device bytes of weights, gradients and optimizer state at `stage` (dszero's estimators)."""
    from dszero.estimators import zero2_estimates, zero3_estimates

    n = max(data_parallel, 1)
    if stage == 0:
        return 16 * num_params
    if stage == 1:
        return 4 * num_params + (0 if offload_optimizer else 12 * num_params // n)
    if stage == 2:
        wanted = f"offload_optimizer={'cpu' if offload_optimizer else 'none'}"
        rows = zero2_estimates(num_params, num_gpus_per_node=n)
    else:
        wanted = (f"offload_param={'cpu' if offload_param else 'none'}, "
                  f"offload_optimizer={'cpu' if offload_optimizer or offload_param else 'none'}, zero_init=1")
        rows = zero3_estimates(num_params, largest_layer, num_gpus_per_node=n)
    return next(row.per_device_bytes for row in rows if row.options == wanted)


def largest_fitting_micro_batch(stage: int, info: ModelInfo, data_parallel: int, *, offload_optimizer: bool = False,
                                offload_param: bool = False) -> int | None:
    """The largest micro-batch the estimate lets through (0: not even one sample), or None when the
    activation memory is unknown and only experiments can tell."""
    if info.activation_bytes_per_sample <= 0:
        return None
    states = model_state_bytes(stage, info.num_params, info.largest_layer_params, data_parallel,
                               offload_optimizer=offload_optimizer, offload_param=offload_param)
    room = HEADROOM * info.device_memory_bytes - states
    return max(int(room // info.activation_bytes_per_sample), 0)


def describe(stage: int, info: ModelInfo, data_parallel: int, micro_batch: int, **offloads: bool) -> str:
    states = model_state_bytes(stage, info.num_params, info.largest_layer_params, data_parallel, **offloads)
    need = states + info.activation_bytes_per_sample * micro_batch
    return (f"estimated {need / 2**30:.2f} GiB ({states / 2**30:.2f} GiB of model states + "
            f"{info.activation_bytes_per_sample * micro_batch / 2**30:.2f} GiB of activations) against "
            f"{HEADROOM:.0%} of {info.device_memory_bytes / 2**30:.2f} GiB")
