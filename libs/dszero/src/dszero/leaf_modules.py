"""ZeRO-3 leaf modules (DeepSpeed's set_z3_leaf_modules): a module whose parameters stage 3 gathers all at once
when its forward starts, its children getting no hooks of their own.

For modules that call only some of their children, in an order that changes from step to step (a mixture of
experts routing tokens): stage 3 would otherwise gather each child as it is called, and ranks that route
differently would wait on each other's gathers. The flag is DeepSpeed's (`module._z3_leaf`), so a model marked
for DeepSpeed is marked for dszero and the other way round.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from .errors import ZeroConfigError

_FLAG = "_z3_leaf"


def z3_leaf_module(module: torch.nn.Module) -> bool:
    """Whether `module` is marked as a leaf."""
    return bool(getattr(module, _FLAG, False))


def z3_leaf_parameter(param: torch.nn.Parameter) -> bool:
    """Whether `param` belongs to a leaf module (stage 3 marks them when it partitions the model)."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module of `model` marked as a leaf."""
    return [module for module in model.modules() if z3_leaf_module(module)]


def set_z3_leaf_module(module: torch.nn.Module, flag: bool) -> None:
    setattr(module, _FLAG, bool(flag))


def _qualified_name(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module: torch.nn.Module, wanted: type | str) -> bool:
    if isinstance(wanted, type):
        return isinstance(module, wanted)
    return type(module).__name__ == wanted or _qualified_name(module) == wanted


def _mark_by_class(model: torch.nn.Module, classes: Iterable[type | str], flag: bool,
                   raise_if_not_found: bool) -> list[torch.nn.Module]:
    classes = list(classes)
    wrong = [c for c in classes if not isinstance(c, (type, str))]
    if wrong:
        raise ZeroConfigError(f"leaf_module_classes must be module classes or class names (str), got {wrong!r}")
    marked = [module for module in model.modules() if any(_matches(module, c) for c in classes)]
    for module in marked:
        set_z3_leaf_module(module, flag)
    if not marked and raise_if_not_found:
        raise ValueError(f"No modules of type {classes} found in model {type(model).__name__}")
    return marked


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: Iterable[type | str],
                        raise_if_not_found: bool = True) -> list[torch.nn.Module]:
    """Marks every module of `model` that is an instance of one of `leaf_module_classes` (classes, or class names
    plain or qualified) as a leaf; returns them. Nothing matching raises ValueError (unless told not to)."""
    return _mark_by_class(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: Iterable[type | str],
                          raise_if_not_found: bool = True) -> list[torch.nn.Module]:
    """Clears the leaf mark of the modules set_z3_leaf_modules would mark."""
    return _mark_by_class(model, leaf_module_classes, False, raise_if_not_found)


def _mark_by_names(model: torch.nn.Module, names: Iterable[str], flag: bool, raise_if_not_found: bool,
                   match) -> tuple[list[torch.nn.Module], list[str]]:
    named = dict(model.named_modules())
    marked: dict[int, torch.nn.Module] = {}
    missing = []
    for name in names:
        found = [module for module_name, module in named.items() if match(module_name, name)]
        if not found:
            missing.append(name)
        for module in found:
            set_z3_leaf_module(module, flag)
            marked[id(module)] = module
    if missing and raise_if_not_found:
        raise ValueError(f"No modules named {missing} found in model {type(model).__name__} "
                         f"(its module names: {', '.join(list(named)[1:6])}, ...)")
    return list(marked.values()), missing


def set_z3_leaf_modules_by_name(model: torch.nn.Module, module_names: Iterable[str], flag: bool = True,
                                raise_if_not_found: bool = True) -> tuple[list[torch.nn.Module], list[str]]:
    """Marks the modules with these names (as `named_modules()` gives them); returns them and the names not found."""
    return _mark_by_names(model, module_names, flag, raise_if_not_found, lambda name, wanted: name == wanted)


def set_z3_leaf_modules_by_suffix(model: torch.nn.Module, module_name_suffixes: Iterable[str], flag: bool = True,
                                  raise_if_not_found: bool = True) -> tuple[list[torch.nn.Module], list[str]]:
    """Marks every module whose name ends with one of the suffixes; returns them and the suffixes not found."""
    return _mark_by_names(model, module_name_suffixes, flag, raise_if_not_found,
                          lambda name, wanted: name.endswith(wanted))


def apply_leaf_module_config(model: torch.nn.Module, leaf_config: Any) -> list[torch.nn.Module]:
    """`zero_optimization.leaf_module` (dsconfig's LeafModuleConfig, or None): marks the modules of its classes,
    names and name suffixes as leaves and returns them. A class the model lacks is expected (the defaults name
    Hugging Face's MoE blocks); a name or suffix that matches nothing is likely a slip, and is warned about."""
    if leaf_config is None:
        return []
    marked = {id(m): m for m in set_z3_leaf_modules(model, leaf_config.classes, raise_if_not_found=False)}
    for how, setter in (("names", set_z3_leaf_modules_by_name), ("name_suffixes", set_z3_leaf_modules_by_suffix)):
        found, missing = setter(model, getattr(leaf_config, how), raise_if_not_found=False)
        marked.update((id(m), m) for m in found)
        if missing:
            warnings.warn(f"zero_optimization.leaf_module.{how}: {missing} match no module of "
                          f"{type(model).__name__} (its module names: {', '.join(list(dict(model.named_modules()))[1:6])}"
                          f", ...)", stacklevel=2)
    return list(marked.values())
