"""External parameters at stage 3: a parameter one module owns that another module's forward reads (a tied
output projection written as `x @ self.embed.weight.T`, `F.linear(h, self.first.weight)` in a parent).

Stage 3 gathers a unit only around the forward and backward of the module that owns it, so such a read finds
the parameter released (empty). Two ways to make it whole there, as in DeepSpeed:
- `register_external_parameter(module, param)`: `param` is gathered with `module`'s own units, for its forward
  and for its backward, from then on;
- found by itself: each module owning partitioned parameters reads them through `WatchedParameters`; a read
  of a released one while a forward runs gathers it at once and registers it with the innermost module whose
  forward is running (Stage3.read_released), which then gathers it like its own in later steps.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch

# Stage3 schedules alive now (weak: a dropped optimizer takes its schedule with it).
_SCHEDULES: weakref.WeakSet[Any] = weakref.WeakSet()


def track(schedule: Any) -> None:
    _SCHEDULES.add(schedule)


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Gather `parameter` (owned by another module) whenever `module` runs forward or backward."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"register_external_parameter: module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(parameter, torch.nn.Parameter):
        raise TypeError(f"register_external_parameter: parameter must be a torch.nn.Parameter, got "
                        f"{type(parameter).__name__}")
    module.__dict__.setdefault("_ds_external_params", {})[id(parameter)] = parameter
    for schedule in list(_SCHEDULES):
        schedule.add_external(module, parameter)


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Undo register_external_parameter (a parameter not registered with `module` is a ValueError)."""
    registered = module.__dict__.get("_ds_external_params", {})
    if id(parameter) not in registered:
        shape = tuple(getattr(parameter, "ds_shape", parameter.shape))
        raise ValueError(f"unregister_external_parameter: the parameter of shape {shape} "
                         f"is not registered with {type(module).__name__}")
    del registered[id(parameter)]
    for schedule in list(_SCHEDULES):
        schedule.remove_external(module, parameter)


def registered_external(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return list(module.__dict__.get("_ds_external_params", {}).values())


class WatchedParameters(dict):
    """A module's `_parameters`: reading a released partitioned parameter tells the schedule (weakly held)."""

    def __init__(self, items: dict[str, Any], schedule: Any):
        super().__init__(items)
        self.schedule = weakref.ref(schedule)

    def __getitem__(self, name: str) -> Any:
        value = dict.__getitem__(self, name)
        schedule = self.schedule()
        if schedule is not None and value is not None and value.numel() == 0 and hasattr(value, "ds_shape"):
            schedule.read_released(value)
        return value

    def __reduce__(self):  # pickled (torch.save of a whole model) as the plain dict it stands for
        return dict, (dict(self),)

    def __deepcopy__(self, memo: dict) -> dict:
        return {name: copy.deepcopy(value, memo) for name, value in self.items()}


def watch(modules: list[torch.nn.Module], schedule: Any) -> None:
    for module in modules:
        if not isinstance(module._parameters, WatchedParameters):
            module._parameters = WatchedParameters(module._parameters, schedule)


def unwatch(modules: list[torch.nn.Module]) -> None:
    for module in modules:
        if isinstance(module._parameters, WatchedParameters):
            module._parameters = dict(module._parameters)
