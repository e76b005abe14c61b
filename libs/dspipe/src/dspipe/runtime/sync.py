"""The gradient-sync seam: what a pipeline needs from whatever reduces gradients over the data-parallel
group and steps the optimizer. dspipe never imports dszero; the facade hands it a ZeroOptimizer (which
has exactly these members), and `AveragedOptimizer` serves a plain torch optimizer.

The runtime turns sync off for the step's backward passes (gradients accumulate locally over the
micro-batches), sums tied gradients across stages, then calls finish_backward() once this rank's
gradients are complete, and step().
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

import dscomm


@runtime_checkable
class GradientSync(Protocol):
    """What reduces and applies a pipeline rank's gradients."""

    @property
    def backward_scale(self) -> float:
        """What a loss is multiplied by before backward (an fp16 loss scale; 1.0 otherwise)."""
        ...

    def require_gradient_sync(self, enabled: bool) -> None:
        """False: backward passes accumulate gradients locally and communicate nothing."""
        ...

    def finish_backward(self) -> None:
        """The step's gradients are complete: reduce them over the data-parallel group now."""
        ...

    def step(self) -> bool:
        """Apply the reduced gradients; False when the step was skipped (fp16 overflow)."""
        ...


class AveragedOptimizer:
    """A torch optimizer behind the seam: gradients averaged over `group` (all-reduce) at
    finish_backward, then `optimizer.step()` and `zero_grad()`."""

    backward_scale = 1.0

    def __init__(self, optimizer: torch.optim.Optimizer, group: Any = None):
        self.optimizer = optimizer
        self.group = group
        self._reduced = False

    def require_gradient_sync(self, enabled: bool) -> None:
        pass  # nothing is reduced during backward: finish_backward does it all

    def finish_backward(self) -> None:
        if self._reduced:
            return
        self._reduced = True
        if not dist.is_initialized() or dist.get_world_size(self.group) == 1:
            return
        world = dist.get_world_size(self.group)
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                dscomm.all_reduce(param.grad, group=self.group, log_name="pipe_grad_average")
                param.grad.div_(world)

    def step(self) -> bool:
        self.finish_backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self._reduced = False
        return True
