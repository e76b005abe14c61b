"""LAMB with DeepSpeed's FusedLamb semantics, in plain torch (no compiled kernel).

Per parameter, with g the gradient (divided by the group's clip factor when max_grad_norm > 0):
    m = beta1 m + (1 - beta1) g             v = beta2 v + (1 - beta2) g^2
    u = m / (sqrt(v) + eps) + weight_decay p       (sqrt(v + eps) with eps_inside_sqrt)
    trust = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
    p = p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * trust * u   (no bias factor without bias_correction)

Under ZeRO (any stage) dszero steps it through `step_on_shards`: the moments and u are elementwise
on the flat shards, and the norms of each whole tensor (and of the group's gradient, for
max_grad_norm) are summed across the shards (dszero.TensorShards.sum_squares).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive moments (LAMB): Adam moments scaled per tensor by a clamped trust ratio."""

    # Not elementwise: under ZeRO dszero steps it through step_on_shards (its whole-tensor step).

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
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                update = self._moments_and_update(p, p.grad if clip is None else p.grad / clip, group)
                coeff = self._trust_ratio(p, update, group["min_coeff"], group["max_coeff"])
                self.lamb_coeffs.append(coeff)
                step_size = self._step_size(group, self.state[p]["step"])
                p.sub_(update * (coeff * step_size).to(update.dtype))
        return loss

    @torch.no_grad()
    def step_on_shards(self, shards: Any) -> None:
        """The same update on ZeRO's flat master shards (dszero's whole-tensor step, any stage).

        Each flat master holds pieces of several tensors: the trust ratio of each comes from its
        whole-tensor norms, summed over every rank's pieces, and scales its piece of the update."""
        live = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        clipped = [(group, params) for group, params in live if params and group["max_grad_norm"] > 0]
        grad_sq = shards.sum_squares({p: p.grad for _, params in clipped for p in params})[0] if clipped else {}
        updates: dict[torch.Tensor, torch.Tensor] = {}
        for group, params in live:
            clip = None
            if group["max_grad_norm"] > 0 and params:
                norm = torch.stack([grad_sq[p].sum() for p in params]).sum().sqrt()
                clip = torch.clamp((norm + 1e-6) / group["max_grad_norm"], min=1.0).to(params[0].dtype)
            for p in params:
                updates[p] = self._moments_and_update(p, p.grad if clip is None else p.grad / clip, group)
        self.lamb_coeffs = []
        if not updates:
            return
        weight_sq, update_sq = shards.sum_squares({p: p for p in updates}, updates)
        for group, params in live:
            for p in params:
                ratio = (weight_sq[p].sqrt() / update_sq[p].sqrt()).clamp(group["min_coeff"], group["max_coeff"])
                coeffs = torch.where((weight_sq[p] > 0) & (update_sq[p] > 0), ratio, torch.ones_like(ratio))
                self.lamb_coeffs.extend(coeffs.unbind())
                step_size = self._step_size(group, self.state[p]["step"])
                update = updates[p]
                for tensor, coeff in zip(shards.tensors(p), coeffs.tolist()):
                    tensor.piece(update).mul_(coeff * step_size)
                p.sub_(update)

    def _moments_and_update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """Adam's moments (updated in place) and u = m / (sqrt(v) + eps) + weight_decay p, elementwise."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] = int(state["step"]) + 1  # a checkpoint brings it back as a float tensor
        beta1, beta2 = group["betas"]
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
        return update

    @staticmethod
    def _step_size(group: dict, step: int) -> float:
        if not group["bias_correction"]:
            return group["lr"]
        beta1, beta2 = group["betas"]
        return group["lr"] * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)

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
