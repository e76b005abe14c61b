"""LAMB with DeepSpeed's FusedLamb semantics, in plain torch (no compiled kernel).

Per parameter, with g the gradient (divided by the group's clip factor when max_grad_norm > 0):
    m = beta1 m + (1 - beta1) g             v = beta2 v + (1 - beta2) g^2
    u = m / (sqrt(v) + eps) + weight_decay p       (sqrt(v + eps) with eps_inside_sqrt)
    trust = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
    p = p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * trust * u   (no bias factor without bias_correction)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive moments (LAMB): Adam moments scaled per tensor by a clamped trust ratio."""

    needs_whole_tensors = True  # per-tensor update: the engine runs it on views of ZeRO's flat buffers

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, eps_inside_sqrt: bool = False,
                 weight_decay: float = 0.0, max_grad_norm: float = 0.0, max_coeff: float = 10.0,
                 min_coeff: float = 0.01, amsgrad: bool = False):
        if amsgrad:
            raise ValueError("Lamb does not support amsgrad (nor does DeepSpeed's FusedLamb); set amsgrad: false")
        if not 0.0 <= min_coeff <= max_coeff:
            raise ValueError(f"Lamb needs 0 <= min_coeff <= max_coeff, got min_coeff={min_coeff}, "
                             f"max_coeff={max_coeff}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm, max_coeff=max_coeff,
                        min_coeff=min_coeff)
        super().__init__(params, defaults)
        self.eps_mode = 0 if eps_inside_sqrt else 1  # FusedLamb's name for where eps goes
        self.lamb_coeffs: list[torch.Tensor] = []

    def get_lamb_coeffs(self) -> list[float]:
        """The trust ratio each parameter got in the last step, in param-group order."""
        return [float(c) for c in self.lamb_coeffs]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.lamb_coeffs = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            clip = self._clip_factor(params, group["max_grad_norm"])
            beta1, beta2 = group["betas"]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                grad = p.grad if clip is None else p.grad / clip
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if self.eps_mode == 0:
                    denom = (exp_avg_sq + group["eps"]).sqrt_()
                else:
                    denom = exp_avg_sq.sqrt().add_(group["eps"])
                update = exp_avg / denom
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])
                coeff = self._trust_ratio(p, update, group["min_coeff"], group["max_coeff"])
                self.lamb_coeffs.append(coeff)
                step_size = group["lr"]
                if group["bias_correction"]:
                    step = state["step"]
                    step_size = step_size * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
                p.sub_(update * (coeff * step_size).to(update.dtype))
        return loss

    @staticmethod
    def _trust_ratio(p: torch.Tensor, update: torch.Tensor, min_coeff: float, max_coeff: float) -> torch.Tensor:
        # Kept a tensor: no device sync per parameter.
        dtype = torch.promote_types(p.dtype, torch.float32)  # half norms overflow
        w_norm = torch.linalg.vector_norm(p, dtype=dtype)
        u_norm = torch.linalg.vector_norm(update, dtype=dtype)
        ratio = (w_norm / u_norm).clamp(min_coeff, max_coeff)
        return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))

    @staticmethod
    def _clip_factor(params: list[torch.Tensor], max_grad_norm: float) -> torch.Tensor | None:
        # FusedLamb divides the group's gradients by (norm + 1e-6) / max_grad_norm when that exceeds 1.
        if max_grad_norm <= 0:
            return None
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))
        factor = (norm + 1e-6) / max_grad_norm
        return torch.clamp(factor, min=1.0)
