"""Optimizer and scheduler names and their `params`.

dsconfig imports no torch, so the names of torch's optimizers and schedulers are listed here;
the facade builds them. Params of the optimizers and schedulers dstrain builds itself are checked
key by key (a typo in `warmup_num_steps` would otherwise be a TypeError deep in the engine).
"""

from __future__ import annotations

from typing import Any

from .converter import CONVERTER, BadValue, problems_from
from .errors import Problem
from .fields import Auto

# Built by dstrain itself.
DSTRAIN_OPTIMIZERS = ("Adam", "AdamW", "Lamb", "Muon")
# DeepSpeed optimizers dstrain does not implement (a client optimizer can replace them).
DEEPSPEED_ONLY_OPTIMIZERS = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Lion", "CPUAdam", "FusedAdam")
TORCH_OPTIMIZERS = ("Adadelta", "Adafactor", "Adagrad", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam", "RMSprop",
                    "Rprop", "SGD", "SparseAdam")

DSTRAIN_SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
TORCH_SCHEDULERS = ("LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
                    "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau",
                    "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR")

_NUMBER = float | Auto
_BETAS = list[float] | Auto
_ADAM_PARAMS: dict[str, Any] = {
    "lr": _NUMBER, "betas": _BETAS, "eps": _NUMBER, "weight_decay": _NUMBER, "bias_correction": bool,
    "amsgrad": bool, "adam_w_mode": bool, "torch_adam": bool, "set_grad_none": bool, "fused": bool | None,
    "foreach": bool | None, "maximize": bool, "capturable": bool, "differentiable": bool,
}
OPTIMIZER_PARAMS: dict[str, dict[str, Any]] = {
    "Adam": _ADAM_PARAMS,
    "AdamW": _ADAM_PARAMS,
    "Lamb": {"lr": _NUMBER, "betas": _BETAS, "eps": _NUMBER, "weight_decay": _NUMBER, "bias_correction": bool,
             "max_grad_norm": float, "max_coeff": float, "min_coeff": float, "amsgrad": bool, "adam_w_mode": bool},
    "Muon": {"lr": _NUMBER, "momentum": _NUMBER, "weight_decay": _NUMBER, "muon_lr": _NUMBER, "adam_lr": _NUMBER,
             "torch_adam": bool, "adam_w_mode": bool, "ns_method": str, "per_head_muon": bool, "betas": _BETAS,
             "eps": _NUMBER, "ns_steps": int, "nesterov": bool},
}
_WARMUP = {"warmup_min_lr": _NUMBER, "warmup_max_lr": _NUMBER, "warmup_num_steps": int | Auto,
           "warmup_type": str, "last_batch_iteration": int}
SCHEDULER_PARAMS: dict[str, dict[str, Any]] = {
    "WarmupLR": _WARMUP,
    "WarmupDecayLR": {**_WARMUP, "total_num_steps": int | Auto},
    "WarmupCosineLR": {"total_num_steps": int | Auto, "warmup_min_ratio": _NUMBER, "warmup_num_steps": int | Auto,
                       "cos_min_ratio": _NUMBER, "warmup_type": str, "last_batch_iteration": int},
    "OneCycle": {"cycle_min_lr": float, "cycle_max_lr": float, "decay_lr_rate": float, "cycle_first_step_size": int,
                 "cycle_second_step_size": int | None, "cycle_first_stair_count": int,
                 "cycle_second_stair_count": int | None, "decay_step_size": int, "cycle_momentum": bool,
                 "cycle_min_mom": float, "cycle_max_mom": float, "decay_mom_rate": float,
                 "last_batch_iteration": int},
    "LRRangeTest": {"lr_range_test_min_lr": float, "lr_range_test_step_size": int, "lr_range_test_step_rate": float,
                    "lr_range_test_staircase": bool, "last_batch_iteration": int},
}
_CHOICES = {"warmup_type": ("log", "linear"), "ns_method": ("gram", "standard")}


def canonical_name(name: str, *groups: tuple[str, ...]) -> str | None:
    lowered = name.strip().lower()
    for group in groups:
        for candidate in group:
            if candidate.lower() == lowered:
                return candidate
    return None


def check_params(path: str, params: dict, table: dict[str, Any], unknown: list[str]) -> list[Problem]:
    """Type-check known params; unknown names go to `unknown` (warning or error, by strictness)."""
    import difflib

    problems = []
    for key, value in params.items():
        where = f"{path}.{key}"
        if key not in table:
            close = difflib.get_close_matches(key, list(table), n=1, cutoff=0.7)
            unknown.append(where + (f" (did you mean '{close[0]}'?)" if close else ""))
            continue
        try:
            CONVERTER.structure(value, table[key])
        except BadValue as exc:
            problems.extend(problems_from(exc, where))
            continue
        if key in _CHOICES and value not in _CHOICES[key]:
            problems.append(Problem(where, f"must be one of {', '.join(map(repr, _CHOICES[key]))}", value))
        if key == "betas" and isinstance(value, list) and len(value) != 2:
            problems.append(Problem(where, "must be a list of two numbers [beta1, beta2]", value))
    return problems
