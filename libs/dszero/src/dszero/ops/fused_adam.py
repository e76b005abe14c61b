"""`FusedAdam`: DeepSpeed's FusedAdam signature and arithmetic on any device and dtype.

DeepSpeed's is a CUDA multi-tensor kernel; this runs the same update (the one CPUAdam's native kernel
runs) with torch._foreach_* ops, so a script that names FusedAdam trains the same on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import ZeroConfigError
from .cpu_adam import _foreach_adam


class FusedAdam(torch.optim.Optimizer):
    """Adam (adam_w_mode=False) or AdamW (True, the default), with optional bias correction."""

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True):
        if amsgrad:
            raise ZeroConfigError("FusedAdam: amsgrad=True is not supported (nor by DeepSpeed's FusedAdam); use "
                                  "torch.optim.Adam(amsgrad=True)")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas) or not lr >= 0 or not eps >= 0 \
                or not weight_decay >= 0:
            raise ZeroConfigError(f"FusedAdam: invalid lr={lr}, betas={betas}, eps={eps} or weight_decay="
                                  f"{weight_decay} (valid: lr, eps, weight_decay >= 0; betas two numbers in [0, 1))")
        super().__init__(params, {"lr": lr, "bias_correction": bias_correction, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "adam_w_mode": adam_w_mode})
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            # One foreach call per (device, dtype): the ops need their tensors alike.
            batches: dict[tuple, tuple[list, list, list, list, list]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ZeroConfigError("FusedAdam: sparse gradients are not supported; use torch.optim.SparseAdam")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                batch = batches.setdefault((p.device, p.dtype), ([], [], [], [], []))
                for items, item in zip(batch, (p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                                               int(state["step"].item()))):
                    items.append(item)
            for params, grads, exp_avgs, exp_avg_sqs, steps in batches.values():
                _foreach_adam(params, grads, exp_avgs, exp_avg_sqs, steps, group["lr"], beta1, beta2, group["eps"],
                              group["weight_decay"], group["adam_w_mode"], group["bias_correction"],
                              [None] * len(params))
        return loss
