"""CPU Adam/AdamW: one fused, vectorised, multithreaded pass per tensor (ZeRO's CPU-offload step).

The native kernel (``dszero._cpu_adam``, built by setup.py when a C++ compiler is there) does the
work; torch tensors reach it as data pointers after the checks here. Without it, a
``torch._foreach_*`` implementation of the same arithmetic runs, announced once with a warning.
``DSZERO_NO_NATIVE=1`` in the environment (read at every step) forces that fallback.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence

import torch

from ..errors import ZeroConfigError

# Dtype codes shared with csrc/cpu_adam.cpp.
_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_NO_COPY = 3
_STATE_DTYPES = (torch.float32, torch.bfloat16)
_COPY_DTYPES = (torch.bfloat16, torch.float16)

_native = None  # the extension module once imported; False when it could not be
_native_problem = ""
_fallback_announced = False


def _load_native():
    global _native, _native_problem
    if _native is None:
        try:
            from .. import _cpu_adam
        except ImportError as exc:
            _native, _native_problem = False, f"the native CPU Adam kernel is not built ({exc})"
        else:
            _native = _cpu_adam
    return _native or None


def native_available() -> bool:
    """Whether the compiled kernel is importable (independently of DSZERO_NO_NATIVE)."""
    return _load_native() is not None


def _kernel():
    """The native module, or None when the torch fallback must run."""
    if os.environ.get("DSZERO_NO_NATIVE") == "1":
        return None  # asked for: no warning
    native = _load_native()
    if native is None:
        global _fallback_announced
        if not _fallback_announced:
            _fallback_announced = True
            warnings.warn(f"dszero: {_native_problem}; CPUAdam uses torch._foreach_* ops, which are slower. "
                          "Reinstall dszero with a C++17 compiler and pybind11 available to build it.",
                          RuntimeWarning, stacklevel=3)
    return native


def _describe(t: torch.Tensor) -> str:
    return f"dtype={t.dtype}, device={t.device}, shape={tuple(t.shape)}"


def _check(name: str, t, dtypes: Sequence[torch.dtype], numel: int | None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ZeroConfigError(f"cpu_adam_step: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ZeroConfigError(f"cpu_adam_step: {name} is on {t.device} ({_describe(t)}); CPU Adam updates "
                              "CPU tensors only (move it with .cpu(), or use a device optimizer)")
    if t.layout != torch.strided:
        raise ZeroConfigError(f"cpu_adam_step: {name} has layout {t.layout} ({_describe(t)}); "
                              "only dense (torch.strided) tensors are valid")
    if t.dtype not in dtypes:
        valid = " or ".join(str(d) for d in dtypes)
        raise ZeroConfigError(f"cpu_adam_step: {name} has dtype {t.dtype} ({_describe(t)}); valid: {valid}")
    if not t.is_contiguous():
        raise ZeroConfigError(f"cpu_adam_step: {name} is not contiguous ({_describe(t)}, "
                              f"stride={t.stride()}); pass {name}.contiguous() or a flat buffer")
    if numel is not None and t.numel() != numel:
        raise ZeroConfigError(f"cpu_adam_step: {name} has {t.numel()} elements ({_describe(t)}) but param has "
                              f"{numel}; every tensor of one step must have the same number of elements")


def cpu_adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0,
                  adamw_mode: bool = True, bias_correction: bool = True,
                  low_precision_copy: torch.Tensor | None = None) -> None:
    """One Adam/AdamW step in place on contiguous CPU tensors of equal element count (flat buffers).

    param is float32; grad, exp_avg and exp_avg_sq are float32 or bfloat16 (the two moments share a
    dtype); step counts this step (1 on the first). low_precision_copy, if given (bfloat16 or
    float16), receives the updated param cast to its dtype in the same pass.
    """
    _check("param", param, (torch.float32,), None)
    n = param.numel()
    _check("grad", grad, _STATE_DTYPES, n)
    _check("exp_avg", exp_avg, _STATE_DTYPES, n)
    _check("exp_avg_sq", exp_avg_sq, (exp_avg.dtype,), n)
    if low_precision_copy is not None:
        _check("low_precision_copy", low_precision_copy, _COPY_DTYPES, n)
    if int(step) < 1:
        raise ZeroConfigError(f"cpu_adam_step: step={step}; it counts the step being taken, so it is >= 1")
    kernel = _kernel()
    if kernel is None:
        _foreach_adam([param], [grad], [exp_avg], [exp_avg_sq], [int(step)], lr, beta1, beta2, eps,
                      weight_decay, adamw_mode, bias_correction, [low_precision_copy])
        return
    kernel.adam_step(param.data_ptr(), grad.data_ptr(), _CODES[grad.dtype], exp_avg.data_ptr(),
                     exp_avg_sq.data_ptr(), _CODES[exp_avg.dtype],
                     0 if low_precision_copy is None else low_precision_copy.data_ptr(),
                     _NO_COPY if low_precision_copy is None else _CODES[low_precision_copy.dtype],
                     n, int(step), float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
                     bool(adamw_mode), bool(bias_correction), torch.get_num_threads())


def _foreach_adam(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                  exp_avg_sqs: list[torch.Tensor], steps: list[int], lr: float, beta1: float, beta2: float,
                  eps: float, weight_decay: float, adamw_mode: bool, bias_correction: bool,
                  low_copies: list[torch.Tensor | None]) -> None:
    """The native kernel's arithmetic, op for op, with torch._foreach_* (the fallback path)."""
    # 16-bit grads and moments are computed in float32 and rounded once when stored, as the kernel does.
    grads = [g.float() for g in grads]
    avgs = [m.float() for m in exp_avgs]
    avg_sqs = [v.float() for v in exp_avg_sqs]
    if weight_decay != 0.0:
        if adamw_mode:
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(avg_sqs, beta2)
    torch._foreach_addcmul_(avg_sqs, grads, grads, 1.0 - beta2)
    bc1 = [1.0 - beta1**s if bias_correction else 1.0 for s in steps]
    bc2_sqrt = [(1.0 - beta2**s) ** 0.5 if bias_correction else 1.0 for s in steps]
    denoms = torch._foreach_sqrt(avg_sqs)
    torch._foreach_div_(denoms, bc2_sqrt)
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, avgs, denoms, [-lr / b for b in bc1])
    for stored, computed in (*zip(exp_avgs, avgs), *zip(exp_avg_sqs, avg_sqs)):
        if stored is not computed:
            stored.copy_(computed)
    for low, param in zip(low_copies, params):
        if low is not None:
            low.copy_(param)


class CPUAdam(torch.optim.Optimizer):
    """Adam/AdamW on CPU parameters with the fused native kernel (DeepSpeed's DeepSpeedCPUAdam).

    adamw_mode=True (the default) decays weights decoupled from the gradient, as torch.optim.AdamW;
    False adds weight_decay * param to the gradient, as torch.optim.Adam. The state layout (step,
    exp_avg, exp_avg_sq) is torch.optim.Adam's, so state dicts move between the two.

    Parameters are float32, or bfloat16 / float16 (ZeRO's low-precision master weights): those are
    updated through a float32 copy and rounded once. fp32_optimizer_states=True (the default) keeps
    the moments in float32 whatever the parameter's dtype; False keeps them in the parameter's dtype
    (bf16_optimizer_states). It may be built over device parameters: ZeRO rebinds its groups to the
    offloaded CPU masters before the first step, and a step on anything else is refused by name.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, adamw_mode: bool = True,
                 bias_correction: bool = True, fp32_optimizer_states: bool = True):
        if amsgrad:
            raise ZeroConfigError("CPUAdam: amsgrad=True is not supported (nor is it by DeepSpeed's CPU Adam); "
                                  "use amsgrad=False, or torch.optim.Adam(amsgrad=True) without the fused kernel")
        problems = []
        if not lr >= 0.0:
            problems.append(f"lr={lr} (valid: >= 0)")
        if not eps >= 0.0:
            problems.append(f"eps={eps} (valid: >= 0)")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            problems.append(f"betas={betas} (valid: two numbers in [0, 1))")
        if not weight_decay >= 0.0:
            problems.append(f"weight_decay={weight_decay} (valid: >= 0)")
        if problems:
            raise ZeroConfigError("CPUAdam: invalid " + "; ".join(problems))
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
                    "adamw_mode": adamw_mode, "bias_correction": bias_correction,
                    "fp32_optimizer_states": fp32_optimizer_states}
        super().__init__(params, defaults)

    @property
    def adam_w_mode(self) -> bool:
        """DeepSpeed's DeepSpeedCPUAdam name for adamw_mode (the default of every group)."""
        return bool(self.defaults["adamw_mode"])

    def _check_param(self, index: int, position: int, p: torch.Tensor) -> None:
        if p.device.type != "cpu" or p.dtype not in _CODES:
            raise ZeroConfigError(f"CPUAdam: param_groups[{index}]['params'][{position}] has {_describe(p)}; "
                                  "CPUAdam updates float32, bfloat16 or float16 CPU parameters (ZeRO's offloaded "
                                  "master weights); for device parameters use a device optimizer")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        kernel = _kernel()
        threads = torch.get_num_threads()
        for index, group in enumerate(self.param_groups):
            rest: tuple[list, ...] = ([], [], [], [], [], [])  # for the foreach path
            for position, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # torch.optim.Adam's layout, so state dicts load into either optimizer.
                    self._init_state(state, group, p)
                    state["step"] = torch.zeros((), dtype=torch.float32)
                elif not torch.is_tensor(state["step"]):
                    state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32)
                state["step"] += 1
                self._update(index, position, group, p, state, int(state["step"].item()), kernel, threads, rest)
            self._finish_foreach(group, rest)
        return loss

    @torch.no_grad()
    def step_subgroup(self, subgroup_id: int, closure=None):
        """One step of the parameter (a flat partition) in the groups now, with the moments and step count kept
        under `subgroup_id` instead of under the parameter (DeepSpeed's step_subgroup: ZeRO-3's offloaded sub-groups
        swap their partition into param_groups and step it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index, position, group, p = self._subgroup_param(subgroup_id, "step_subgroup")
        state = self.state[subgroup_id]
        if not state:
            self._init_state(state, group, p)
            state["step"] = 0
        elif state["exp_avg"].shape != p.shape:
            raise ZeroConfigError(f"CPUAdam.step_subgroup({subgroup_id}): its moments have shape "
                                  f"{tuple(state['exp_avg'].shape)} but the parameter stepped now has "
                                  f"{tuple(p.shape)}; a sub-group keeps one partition")
        state["step"] += 1
        rest: tuple[list, ...] = ([], [], [], [], [], [])
        self._update(index, position, group, p, state, state["step"], _kernel(), torch.get_num_threads(), rest)
        self._finish_foreach(group, rest)
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, sub_group_id: int, closure=None):
        """Undo the last step_subgroup of `sub_group_id` from the parameter's current gradient: the parameter, both
        moments and the step count return to what they were before it (to rounding), as DeepSpeed's
        rollback_subgroup does when a speculative step must be taken back."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        state = self.state.get(sub_group_id)
        if not state:
            raise RuntimeError(f"Cannot rollback optimizer state for sub_group_id {sub_group_id} as it has not "
                               f"been initialized (no step_subgroup({sub_group_id}) ran)")
        if state.get("step", 0) <= 0:
            raise RuntimeError(f"Cannot rollback sub_group_id {sub_group_id}: step count is {state.get('step', 0)}")
        _, _, group, p = self._subgroup_param(sub_group_id, "rollback_subgroup")
        _adam_rollback(p, p.grad, state["exp_avg"], state["exp_avg_sq"], int(state["step"]), group["lr"],
                       *group["betas"], group["eps"], group["weight_decay"],
                       group.get("adamw_mode", self.defaults["adamw_mode"]),
                       group.get("bias_correction", self.defaults["bias_correction"]))
        state["step"] -= 1
        return loss

    # ------------------------------------------------------------------ helpers
    def _init_state(self, state: dict, group: dict, p: torch.Tensor) -> None:
        fp32_states = group.get("fp32_optimizer_states", self.defaults["fp32_optimizer_states"])
        state_dtype = torch.float32 if fp32_states else p.dtype
        state["exp_avg"] = torch.zeros_like(p, dtype=state_dtype, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=state_dtype, memory_format=torch.preserve_format)

    def _subgroup_param(self, subgroup_id: int, method: str) -> tuple[int, int, dict, torch.Tensor]:
        """The one parameter with a gradient in the groups: a sub-group's flat partition."""
        found = [(index, position, group, p) for index, group in enumerate(self.param_groups)
                 for position, p in enumerate(group["params"]) if p.grad is not None]
        if len(found) != 1:
            raise ZeroConfigError(f"CPUAdam.{method}({subgroup_id}): a sub-group is one flat partition, but "
                                  f"{len(found)} parameters in param_groups have a gradient; put the sub-group's "
                                  f"partition (with its .grad) alone in param_groups first")
        index, position, _group, p = found[0]
        self._check_param(index, position, p)
        return found[0]

    def _update(self, index: int, position: int, group: dict, p: torch.Tensor, state: dict, step: int, kernel,
                threads: int, rest: tuple[list, ...]) -> None:
        self._check_param(index, position, p)
        if p.grad.is_sparse:
            raise ZeroConfigError("CPUAdam: sparse gradients are not supported; use torch.optim.SparseAdam")
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        # A low-precision parameter is updated in a float32 copy and written back rounded, in one pass.
        low = p if p.dtype != torch.float32 else None
        work = p.float() if low is not None else p
        grad = p.grad if p.grad.dtype in _STATE_DTYPES else p.grad.float()
        native_ok = (kernel is not None and p.is_contiguous() and exp_avg.is_contiguous()
                     and exp_avg_sq.is_contiguous() and exp_avg.dtype in _STATE_DTYPES
                     and exp_avg_sq.dtype == exp_avg.dtype)
        if native_ok:
            grad = grad if grad.is_contiguous() else grad.contiguous()
            kernel.adam_step(work.data_ptr(), grad.data_ptr(), _CODES[grad.dtype], exp_avg.data_ptr(),
                             exp_avg_sq.data_ptr(), _CODES[exp_avg.dtype],
                             0 if low is None else low.data_ptr(), _NO_COPY if low is None else _CODES[low.dtype],
                             p.numel(), step, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                             group.get("adamw_mode", self.defaults["adamw_mode"]),
                             group.get("bias_correction", self.defaults["bias_correction"]), threads)
        else:  # no kernel, a strided param (channels_last...) the flat kernel cannot walk, or fp16 moments
            for items, item in zip(rest, (work, grad, exp_avg, exp_avg_sq, step, low)):
                items.append(item)

    def _finish_foreach(self, group: dict, rest: tuple[list, ...]) -> None:
        if rest[0]:
            beta1, beta2 = group["betas"]
            _foreach_adam(*rest[:5], group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                          group.get("adamw_mode", self.defaults["adamw_mode"]),
                          group.get("bias_correction", self.defaults["bias_correction"]), rest[5])


def _adam_rollback(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   adamw_mode: bool, bias_correction: bool) -> None:
    """The inverse of one Adam/AdamW step (the kernel's arithmetic run backwards, in float32), in place."""
    work, g = param.float(), grad.float()
    avg, avg_sq = exp_avg.float(), exp_avg_sq.float()
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2_sqrt = (1.0 - beta2**step) ** 0.5 if bias_correction else 1.0
    work = work + (lr / bc1) * avg / (avg_sq.sqrt() / bc2_sqrt + eps)
    if weight_decay != 0.0:
        if adamw_mode:
            work = work / (1.0 - lr * weight_decay)
        else:
            g = g + weight_decay * work  # the gradient the step saw included the decay of the parameter before it
    avg = (avg - (1.0 - beta1) * g) / beta1
    avg_sq = ((avg_sq - (1.0 - beta2) * g * g) / beta2).clamp_(min=0.0)
    param.copy_(work)
    exp_avg.copy_(avg)
    exp_avg_sq.copy_(avg_sq)
