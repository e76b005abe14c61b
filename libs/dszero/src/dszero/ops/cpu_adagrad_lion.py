"""DeepSpeed's other CPU optimizers for ZeRO's optimizer offload: Adagrad and Lion, on CPU parameters.

Both run as torch's foreach ops over each group's float32 work copies (no native kernel: neither is the hot
path Adam is). Low-precision parameters (ZeRO's bf16/fp16 masters) are updated through a float32 copy and
rounded once, and keep float32 state unless fp32_optimizer_states=False, as CPUAdam does.

Adagrad follows DeepSpeed's kernel, which differs from torch.optim.Adagrad under weight decay: the decay enters
the squared-gradient sum but the update's numerator is the raw gradient. Without weight decay the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import ZeroConfigError

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_hyper(name: str, problems: list[str]) -> None:
    if problems:
        raise ZeroConfigError(f"{name}: invalid " + "; ".join(problems))


class _CPUOptimizer(torch.optim.Optimizer):
    _name = ""

    _any_device = False  # the fused (device) variants step wherever their parameters are
    _takes_sparse = False

    def _params_to_step(self, index: int, group: dict) -> list[torch.Tensor]:
        params = []
        for position, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if (p.device.type != "cpu" and not self._any_device) or p.dtype not in _DTYPES:
                raise ZeroConfigError(f"{self._name}: param_groups[{index}]['params'][{position}] is a {p.dtype} "
                                      f"tensor on {p.device}; it updates float32, bfloat16 or float16 CPU "
                                      "parameters (ZeRO's offloaded master weights)")
            if p.grad.is_sparse and not self._takes_sparse:
                raise ZeroConfigError(f"{self._name}: param_groups[{index}]['params'][{position}] has a sparse "
                                      "gradient, which it does not take; use torch.optim.SparseAdam")
            params.append(p)
        return params

    def _state_dtype(self, group: dict, p: torch.Tensor) -> torch.dtype:
        return torch.float32 if group["fp32_optimizer_states"] else p.dtype

    @staticmethod
    def _write_back(params: list[torch.Tensor], work: list[torch.Tensor]) -> None:
        for p, w in zip(params, work):
            if w is not p:
                p.copy_(w)


class CPUAdagrad(_CPUOptimizer):
    """Adagrad on CPU parameters (DeepSpeed's DeepSpeedCPUAdagrad): sum += g^2; p -= lr * g / (sqrt(sum) + eps)."""

    _name = "CPUAdagrad"
    _takes_sparse = True  # embeddings with sparse=True: only the rows a step touched are updated

    def __init__(self, params: Iterable, lr: float = 1e-2, eps: float = 1e-10, weight_decay: float = 0.0,
                 amsgrad: bool = False, fp32_optimizer_states: bool = True):
        if amsgrad:
            raise ZeroConfigError("CPUAdagrad: amsgrad=True means nothing for Adagrad (DeepSpeed ignores it); "
                                  "leave it False")
        problems = [f"{key}={value} (valid: >= 0)" for key, value in
                    (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)) if not value >= 0.0]
        _check_hyper(self._name, problems)
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
                                  "fp32_optimizer_states": fp32_optimizer_states})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            params = self._params_to_step(index, group)
            for p in [p for p in params if p.grad.is_sparse]:
                self._sparse_step(group, p)
            params = [p for p in params if not p.grad.is_sparse]
            if not params:
                continue
            sums = []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self._state_dtype(group, p))
                state["step"] += 1
                sums.append(state["exp_avg_sq"])
            work = [p if p.dtype == torch.float32 else p.float() for p in params]
            grads = [p.grad.float() for p in params]
            decayed = torch._foreach_add(grads, work, alpha=group["weight_decay"]) if group["weight_decay"] else grads
            sums32 = [s.float() for s in sums]
            torch._foreach_addcmul_(sums32, decayed, decayed)
            denominators = torch._foreach_sqrt(sums32)
            torch._foreach_add_(denominators, group["eps"])
            torch._foreach_addcdiv_(work, grads, denominators, value=-group["lr"])
            self._write_back(params, work)
            self._write_back(sums, sums32)
        return loss


    def _sparse_step(self, group: dict, p: torch.Tensor) -> None:
        """The same update on the elements a sparse gradient holds; the rest of the parameter and its sum stay."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=self._state_dtype(group, p))
        state["step"] += 1
        grad = p.grad.coalesce()
        where = tuple(grad.indices())  # coalesced: each element (or row, for an embedding) once
        values = grad.values().float()
        work = p.data[where].float()
        total = state["exp_avg_sq"][where].float()
        decayed = values + group["weight_decay"] * work if group["weight_decay"] else values
        total += decayed * decayed
        work -= group["lr"] * values / (total.sqrt() + group["eps"])
        p.data[where] = work.to(p.dtype)
        state["exp_avg_sq"][where] = total.to(state["exp_avg_sq"].dtype)


class CPULion(_CPUOptimizer):
    """Lion on CPU parameters (DeepSpeed's DeepSpeedCPULion): p = p * (1 - lr * wd) - lr * sign(b1 * m + (1 - b1) g);
    m = b2 * m + (1 - b2) * g."""

    _name = "CPULion"

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, fp32_optimizer_states: bool = True):
        problems = [f"{key}={value} (valid: >= 0)" for key, value in (("lr", lr), ("weight_decay", weight_decay))
                    if not value >= 0.0]
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            problems.append(f"betas={betas} (valid: two numbers in [0, 1))")
        _check_hyper(self._name, problems)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay,
                                  "fp32_optimizer_states": fp32_optimizer_states})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            params = self._params_to_step(index, group)
            if not params:
                continue
            beta1, beta2 = group["betas"]
            moments = []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=self._state_dtype(group, p))
                state["step"] += 1
                moments.append(state["exp_avg"])
            work = [p if p.dtype == torch.float32 else p.float() for p in params]
            grads = [p.grad.float() for p in params]
            moments32 = [m.float() for m in moments]
            if group["weight_decay"]:
                torch._foreach_mul_(work, 1.0 - group["lr"] * group["weight_decay"])
            update = torch._foreach_mul(moments32, beta1)
            torch._foreach_add_(update, grads, alpha=1.0 - beta1)
            torch._foreach_add_(work, torch._foreach_sign(update), alpha=-group["lr"])
            torch._foreach_mul_(moments32, beta2)
            torch._foreach_add_(moments32, grads, alpha=1.0 - beta2)
            self._write_back(params, work)
            self._write_back(moments, moments32)
        return loss


class DeepSpeedCPUAdagrad(CPUAdagrad):
    """CPUAdagrad under DeepSpeed's name and positional order (deepspeed.ops.adagrad.DeepSpeedCPUAdagrad).

    adamw_mode=False is taken (Accelerate passes it when it swaps torch's Adagrad for this one under optimizer
    offload): Adagrad's decay is added to the gradient, which is what False means; True is refused."""

    def __init__(self, model_params, lr: float = 1e-2, eps: float = 1e-10, weight_decay: float = 0.0,
                 amsgrad: bool = False, fp32_optimizer_states: bool = True, *, adamw_mode: bool = False):
        if adamw_mode:
            raise ZeroConfigError("DeepSpeedCPUAdagrad: adamw_mode=True (decoupled weight decay) is not Adagrad's; "
                                  "its decay is added to the gradient (adamw_mode=False)")
        super().__init__(model_params, lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         fp32_optimizer_states=fp32_optimizer_states)


class DeepSpeedCPULion(CPULion):
    """CPULion under DeepSpeed's name and positional order (deepspeed.ops.lion.DeepSpeedCPULion).

    adamw_mode is taken and has no effect (Accelerate passes False when it swaps bitsandbytes' Lion for this one):
    Lion's weight decay is decoupled by definition, in bitsandbytes' Lion as here."""

    def __init__(self, model_params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, fp32_optimizer_states: bool = True, *, adamw_mode: bool | None = None):
        super().__init__(model_params, lr=lr, betas=betas, weight_decay=weight_decay,
                         fp32_optimizer_states=fp32_optimizer_states)


class FusedLion(CPULion):
    """Lion on parameters on any device (DeepSpeed's FusedLion, its GPU optimizer): the same arithmetic as CPULion,
    in torch's foreach ops on the parameters' device."""

    _name = "FusedLion"
    _any_device = True
