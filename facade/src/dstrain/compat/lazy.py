"""Submodules as attributes of their package, loaded on first use, as DeepSpeed's package imports them all at
start-up: `deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES` (Accelerate) and
`deepspeed.runtime.zero.partition_parameters.ZeroParamStatus` (DeepSpeed-Chat) are read as attribute chains,
never imported by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType


def submodule_attributes(package: str, submodules: dict[str, str], deepspeed_name: str) -> Callable[[str], ModuleType]:
    """A module `__getattr__` for `package` (DeepSpeed's `deepspeed_name`): attribute name -> module (relative
    to `package` when it starts with a dot), imported when first asked for."""

    def __getattr__(name: str) -> ModuleType:
        target = submodules.get(name)
        if target is None:
            if name.startswith("__"):
                raise AttributeError(f"module {package!r} has no attribute {name!r}")  # a probe (copy, pickle, ...)
            from .callers import missing

            raise AttributeError(f"module {package!r} has no attribute {name!r}: {missing(f'{deepspeed_name}.{name}')}")
        return importlib.import_module(target, package)

    return __getattr__
