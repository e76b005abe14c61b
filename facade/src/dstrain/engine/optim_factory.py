"""Turn the config's `optimizer` and `scheduler` sections into objects.

Adam / AdamW are torch's (DeepSpeed's fused kernels compute the same update), and under CPU/NVMe
optimizer offload dszero's fused CPUAdam, as DeepSpeed selects DeepSpeedCPUAdam (torch_adam: true
keeps torch's); Lamb and Muon are
dstrain.ops; any other name is the torch.optim (or torch.optim.lr_scheduler) class of that name.
For Muon, given the model, the parameters are first tagged by DeepSpeed's rules (ops/muon_params.py:
which take Muon, and with per_head_muon which are split per attention head).
Every params problem is reported at once, each as `optimizer.params.<key>` with what is valid.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

import dsconfig
from dsconfig import ConfigError, Problem

from ..ops import Lamb, Muon
from ..ops.muon_params import select_muon_parameters, tag_attention_heads
from . import lr_schedules

_DEEPSPEED_SCHEDULERS = {name: getattr(lr_schedules, name) for name in lr_schedules.__all__}

# Adam keys of DeepSpeed's FusedAdam that torch's Adam / AdamW do not take.
_ADAM_ONLY_KEYS = ("adam_w_mode", "torch_adam", "bias_correction", "set_grad_none")

__all__ = ["build_optimizer", "build_scheduler"]


def build_optimizer(config: dsconfig.OptimizerConfig, params_or_groups: Iterable[Any],
                    model: torch.nn.Module | None = None, *, offloaded: bool = False,
                    fp32_optimizer_states: bool = True) -> torch.optim.Optimizer:
    """The optimizer `config.type` names, over the parameters (or param-group dicts) given; `model`
    (the module they belong to) lets Muon tag its parameters by name and shape first. `offloaded`: the
    step runs on the CPU (zero_optimization.offload_optimizer), where Adam / AdamW are dszero's CPUAdam
    with fp32 moments or, given fp32_optimizer_states=False, moments in the master weights' dtype."""
    name = config.type
    params = dict(config.params)
    _refuse_auto("optimizer", params)
    lowered = name.lower()
    if lowered in ("adam", "adamw") and offloaded and params.get("torch_adam") is not True:
        cls, params = _cpu_adam(lowered == "adamw", params, fp32_optimizer_states)
    elif lowered in ("adam", "adamw"):
        cls, params = _adam(lowered == "adamw", params)
    elif lowered == "lamb":
        cls = Lamb
        if params.pop("adam_w_mode", True) is not True:
            raise ConfigError(Problem("optimizer.params.adam_w_mode", "Lamb always decays weights inside its "
                                      "update (FusedLamb has no L2 mode); remove the key or set it to true", False))
    elif lowered == "muon":
        cls = Muon
        if model is not None:
            _tag_for_muon(model, bool(params.get("per_head_muon", False)))
    else:
        cls = _torch_class(torch.optim, name, "optimizer", torch.optim.Optimizer)
    if "betas" in params and isinstance(params["betas"], list):
        params["betas"] = tuple(params["betas"])
    _check_kwargs(cls, params, "optimizer", skip=("params", "model_params"))  # DeepSpeedCPUAdam names it so
    return cls(params_or_groups, **params)


def build_scheduler(config: dsconfig.SchedulerConfig, optimizer: Any) -> Any:
    """The schedule `config.type` names (DeepSpeed's or a torch.optim.lr_scheduler class) over `optimizer`."""
    params = dict(config.params)
    _refuse_auto("scheduler", params)
    cls = next((c for n, c in _DEEPSPEED_SCHEDULERS.items() if n.lower() == config.type.lower()), None)
    if cls is None:
        cls = _torch_class(torch.optim.lr_scheduler, config.type, "scheduler", None)
    _check_kwargs(cls, params, "scheduler", skip=("optimizer",))
    return cls(optimizer, **params)


def _adam(named_adamw: bool, params: dict) -> tuple[type, dict]:
    # DeepSpeed: type AdamW is always decoupled; type Adam is decoupled unless adam_w_mode is false.
    adam_w_mode = params.pop("adam_w_mode", True)
    params.pop("torch_adam", None)  # torch's implementation is the only one here
    params.pop("set_grad_none", None)  # torch's zero_grad() already sets grads to None
    if params.pop("bias_correction", True) is not True:
        raise ConfigError(Problem("optimizer.params.bias_correction", "torch's Adam always corrects the moment "
                                  "bias; remove the key or set it to true (false is only in DeepSpeed's FusedAdam)",
                                  False))
    params.setdefault("weight_decay", 0.0)  # FusedAdam's default; torch's AdamW would decay by 0.01
    return (torch.optim.AdamW if named_adamw or adam_w_mode else torch.optim.Adam), params


def _cpu_adam(named_adamw: bool, params: dict, fp32_optimizer_states: bool) -> tuple[type, dict]:
    from dszero.ops import DeepSpeedCPUAdam  # dszero's CPUAdam under the class name DeepSpeed builds here

    # DeepSpeed: type AdamW is always decoupled; type Adam is decoupled unless adam_w_mode is false.
    params["adamw_mode"] = params.pop("adam_w_mode", True) or named_adamw
    params.pop("torch_adam", None)
    params.pop("set_grad_none", None)
    params["fp32_optimizer_states"] = fp32_optimizer_states
    return DeepSpeedCPUAdam, params


def _tag_for_muon(model: torch.nn.Module, per_head: bool) -> None:
    select_muon_parameters(model)
    if not per_head:
        return
    tags = tag_attention_heads(model)
    if not tags.tagged:
        # An explicit opt-in that could do nothing is an error, as DeepSpeed's initialize raises.
        skipped = f"; {len(tags.unconfirmed)} attention projection(s) confirmed no geometry of the model's config" \
                  f" and {len(tags.conflicts)} had conflicting ones" if tags.unconfirmed or tags.conflicts else ""
        raise ConfigError(Problem("optimizer.params.per_head_muon", f"is true but no attention projection could be "
                                  f"split per head (q/k/v projections whose rows are heads x width of the model's "
                                  f"config{skipped}); set it to false", True))


def _torch_class(module: Any, name: str, section: str, base: type | None) -> type:
    lowered = name.lower()
    for attr in dir(module):
        candidate = getattr(module, attr)
        if attr.lower() == lowered and isinstance(candidate, type) and (base is None or issubclass(candidate, base)):
            return candidate
    own = ["Adam", "AdamW", "Lamb", "Muon"] if section == "optimizer" else list(_DEEPSPEED_SCHEDULERS)
    raise ConfigError(Problem(f"{section}.type", f"is not a dstrain {section} nor a {module.__name__} class; "
                                                 f"valid: {', '.join(own)}, or a {module.__name__} class name", name))


def _refuse_auto(section: str, params: dict) -> None:
    unresolved = [key for key, value in params.items() if value == dsconfig.AUTO]
    if unresolved:
        raise ConfigError([Problem(f"{section}.params.{key}", "is still \"auto\": resolve it (a launcher or "
                                   "integration fills it in) before building the " + section, "auto")
                           for key in unresolved])


def _check_kwargs(cls: type, params: dict, section: str, skip: tuple[str, ...]) -> None:
    signature = inspect.signature(cls.__init__)
    accepted = [n for n, p in signature.parameters.items()
                if n != "self" and n not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    problems = []
    if not takes_any:
        problems += [Problem(f"{section}.params.{key}", f"is not a parameter of {cls.__name__}; valid: "
                                                         f"{', '.join(accepted)}", value)
                     for key, value in params.items() if key not in accepted]
    required = [n for n, p in signature.parameters.items()
                if n != "self" and n not in skip and p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    problems += [Problem(f"{section}.params.{key}", f"is required by {cls.__name__}") for key in required
                 if key not in params]
    if problems:
        raise ConfigError(problems)
