"""A checkpoint seen whole: what every reader of a foreign or differently laid-out checkpoint produces,
and what loading at another layout consumes.

dstrain's own checkpoints at any data / tensor / pipeline / expert layout, DeepSpeed's checkpoints and
DeepSpeed's universal layout all read into one `WholeCheckpoint`: each tensor whole, by its name in the
model. Loading it into a run is one path (the module's weights, then ZeRO's shards cut by dszero's
`load_parameter_states`, then the scheduler, counters and client state), whatever wrote it; writing one
as DeepSpeed's universal layout is another reader's mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

MASTER = "master"  # the fp32 master weights' key in `parameters` (dszero.checkpoint.by_parameter's)


@dataclass
class WholeCheckpoint:
    """Everything a training run saved, each tensor whole (its full shape, on the CPU)."""

    module: dict[str, torch.Tensor]  # the module's state dict: weights in their training dtype, and buffers
    parameters: dict[str, dict[str, torch.Tensor]]  # per trained parameter: MASTER (fp32) and optimizer state keys
    scalars: dict[str, Any] = field(default_factory=dict)  # the optimizer's per-group scalars ("step", ...)
    param_groups: list[dict[str, Any]] = field(default_factory=list)  # its hyperparameters per group (lr, betas...)
    lr_scheduler: dict[str, Any] | None = None
    client_state: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, int] = field(default_factory=dict)  # global_steps, global_samples, micro_steps, skipped_steps
    loss_scaler: dict[str, Any] | None = None  # fp16: cur_scale and the counters of the dynamic scaler
    step_hooks: dict[str, Any] = field(default_factory=dict)  # {hook name: state}: curriculum, random-LTD
    left_out: list[str] = field(default_factory=list)  # module names the save left out on purpose (frozen ones)
    source: str = "dstrain"  # who wrote it: "dstrain", "deepspeed", "universal" (for messages)
    path: str = ""  # where it was read from (for messages)
