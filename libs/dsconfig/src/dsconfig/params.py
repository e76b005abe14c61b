"""Optimizer and scheduler names and their `params`.

dsconfig imports no torch, so the names of torch's optimizers and schedulers are listed here;
the facade builds them. Params of the optimizers and schedulers dstrain builds itself are checked
key by key (a typo in `warmup_num_steps` would otherwise be a TypeError deep in the engine).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .converter import CONVERTER, BadValue, problems_from
from .errors import LISTED, Problem
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


class Bound(NamedTuple):
    """The valid range of a numeric param: low (inclusive unless low_open), high (exclusive if high_open)."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


_AT_LEAST_0, _AT_LEAST_1, _ABOVE_0 = Bound(0), Bound(1), Bound(0, low_open=True)
_DECAY = Bound(0, 1, high_open=True)  # betas and momenta: 1 would never forget, above 1 diverges
_FRACTION = Bound(0, 1)
# Ranges every torch optimizer checks too (torch raises ValueError at construction, deep in initialize());
# eps > 0 and momentum < 1 are stricter than torch: eps 0 divides by zero, momentum 1 never decays.
OPTIMIZER_BOUNDS: dict[str, Bound] = {"lr": _AT_LEAST_0, "eps": _ABOVE_0, "weight_decay": _AT_LEAST_0,
                                      "betas": _DECAY, "momentum": _DECAY}
_OWN_OPTIMIZER_BOUNDS: dict[str, Bound] = {
    **OPTIMIZER_BOUNDS, "muon_lr": _AT_LEAST_0, "adam_lr": _AT_LEAST_0, "ns_steps": _AT_LEAST_1,
    "max_grad_norm": _AT_LEAST_0, "max_coeff": _AT_LEAST_0, "min_coeff": _AT_LEAST_0}
SCHEDULER_BOUNDS: dict[str, Bound] = {
    "warmup_min_lr": _AT_LEAST_0, "warmup_max_lr": _AT_LEAST_0, "warmup_num_steps": _AT_LEAST_0,
    "total_num_steps": _AT_LEAST_1, "warmup_min_ratio": _FRACTION, "cos_min_ratio": _FRACTION,
    "last_batch_iteration": Bound(-1), "cycle_min_lr": _AT_LEAST_0, "cycle_max_lr": _AT_LEAST_0,
    "decay_lr_rate": _AT_LEAST_0, "cycle_first_step_size": _AT_LEAST_1, "cycle_second_step_size": _AT_LEAST_1,
    "cycle_first_stair_count": _AT_LEAST_0, "cycle_second_stair_count": _AT_LEAST_0,
    "decay_step_size": _AT_LEAST_0, "cycle_min_mom": _DECAY, "cycle_max_mom": _DECAY,
    "decay_mom_rate": _AT_LEAST_0, "lr_range_test_min_lr": _AT_LEAST_0, "lr_range_test_step_size": _AT_LEAST_1,
    "lr_range_test_step_rate": _AT_LEAST_0}
PARAM_BOUNDS = {"optimizer": _OWN_OPTIMIZER_BOUNDS, "scheduler": SCHEDULER_BOUNDS}


def canonical_name(name: str, *groups: tuple[str, ...]) -> str | None:
    lowered = name.strip().lower()
    for group in groups:
        for candidate in group:
            if candidate.lower() == lowered:
                return candidate
    return None


def check_params(path: str, params: dict, table: dict[str, Any], unknown: list[str],
                 bounds: dict[str, Bound]) -> list[Problem]:
    """Type- and range-check known params; unknown names go to `unknown` (warning or error, by strictness)."""
    import difflib

    problems = []
    for key, value in params.items():
        where = f"{path}.{key}"
        if key not in table:
            listed = len(unknown) < LISTED  # suggestions only for the keys a message lists
            close = difflib.get_close_matches(key, list(table), n=1, cutoff=0.7) if listed else []
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
    return problems + check_bounds(path, {key: params[key] for key in params if key in table}, bounds)


def check_bounds(path: str, params: dict, bounds: dict[str, Bound]) -> list[Problem]:
    """Numbers out of their key's range; a list (betas) is checked item by item. Other values are skipped."""
    problems = []
    for key, bound in bounds.items():
        value = params.get(key)
        items = [(f"[{index}]", item) for index, item in enumerate(value)] if isinstance(value, list) else [("", value)]
        for suffix, item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not bound.holds(item):
                problems.append(Problem(f"{path}.{key}{suffix}", f"must be {bound}", item))
    return problems
