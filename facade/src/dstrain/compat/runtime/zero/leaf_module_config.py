"""`deepspeed.runtime.zero.leaf_module_config`: the `zero_optimization.leaf_module` section (dsconfig's
LeafModuleConfig: classes, names and name suffixes of the modules stage 3 gathers whole) under DeepSpeed's names."""

from __future__ import annotations

from typing import Any

import dsconfig
from dsconfig.sections.zero import DEFAULT_LEAF_MODULE_CLASSES as _CLASSES

DEFAULT_LEAF_MODULE_CLASSES: list[str] = list(_CLASSES)
DEFAULT_LEAF_MODULE_NAMES: list[str] = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: list[str] = []


def DeepSpeedZeroLeafModuleConfig(**fields: Any) -> dsconfig.LeafModuleConfig:
    """The section from its keys, read and checked by dsconfig as in a whole config (a string is one name)."""
    return dsconfig.load_section("zero_optimization", {"leaf_module": fields}).leaf_module


__all__ = ["DEFAULT_LEAF_MODULE_CLASSES", "DEFAULT_LEAF_MODULE_NAMES", "DEFAULT_LEAF_MODULE_NAME_SUFFIXES",
           "DeepSpeedZeroLeafModuleConfig"]
