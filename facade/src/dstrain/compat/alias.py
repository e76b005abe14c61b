"""Module aliases: one import path served by another module, the same module object under both names.

Two tables use it:
- `MAPPED_PATHS`: `deepspeed.<path>` -> dstrain's module, registered by `import dstrain.as_deepspeed`
  (and by the launcher in its ranks). A `deepspeed.` path outside the table is an ImportError that
  says so; a path whose library is not installed names the `pip install` line.
- `PUBLIC_PATHS`: the DeepSpeed-shaped public names under `dstrain.` (`dstrain.zero`, `dstrain.comm`,
  `dstrain.pipe`, `dstrain.moe`, `dstrain.runtime`, ...), whose modules live in this `compat`
  package; registered by `import dstrain`, so `from dstrain.moe.layer import MoE` keeps working.

This module imports nothing but the standard library: the launcher registers it before torch loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
from types import ModuleType

_C = "dstrain.compat"

# deepspeed.<path> -> the module that provides it (dstrain's public names: those under PUBLIC_PATHS resolve
# once more, into this package). Every entry is importable where its library is installed.
MAPPED_PATHS: dict[str, str] = {
    "deepspeed": "dstrain",
    "deepspeed.accelerator": "dstrain.accelerator",
    "deepspeed.comm": "dstrain.comm",
    "deepspeed.zero": "dstrain.zero",
    "deepspeed.checkpointing": "dstrain.checkpointing",
    "deepspeed.runtime": "dstrain.runtime",
    "deepspeed.runtime.activation_checkpointing": "dstrain.runtime",
    "deepspeed.runtime.activation_checkpointing.checkpointing": "dstrain.checkpointing",
    "deepspeed.runtime.config": "dstrain.runtime.config",
    "deepspeed.runtime.dataloader": "dstrain.runtime.dataloader",
    "deepspeed.runtime.engine": "dstrain.engine",
    "deepspeed.runtime.lr_schedules": "dstrain.runtime.lr_schedules",
    "deepspeed.runtime.utils": "dstrain.runtime.utils",
    "deepspeed.runtime.zero": "dstrain.runtime.zero",
    "deepspeed.runtime.zero.offload_config": "dstrain.runtime.zero.offload_config",
    "deepspeed.utils": "dstrain.utils",
    "deepspeed.utils.groups": "dscomm.groups",
    "deepspeed.utils.zero_to_fp32": "dstrain.utils.zero_to_fp32",
    "deepspeed.ops": "dstrain.ops",
    "deepspeed.ops.adam": "dstrain.ops.adam",
    "deepspeed.ops.lamb": "dstrain.ops",
    "deepspeed.ops.transformer": "dstrain.ops.transformer",
    "deepspeed.monitor": "dsmonitor",
    "deepspeed.pipe": "dstrain.pipe",
    "deepspeed.moe": "dstrain.moe",
    "deepspeed.moe.layer": "dstrain.moe.layer",
    "deepspeed.moe.utils": "dstrain.moe.utils",
}

# dstrain.<name> (and everything under it) -> its module in this package, or elsewhere in dstrain.
PUBLIC_PATHS: dict[str, str] = {
    "dstrain.zero": f"{_C}.zero",
    "dstrain.comm": f"{_C}.comm",
    "dstrain.pipe": f"{_C}.pipe",
    "dstrain.moe": f"{_C}.moe",
    "dstrain.checkpointing": f"{_C}.checkpointing",
    "dstrain.runtime": f"{_C}.runtime",
    "dstrain.utils": f"{_C}.utils",
    "dstrain.lr_schedules": "dstrain.engine.lr_schedules",
    "dstrain.dataloader": "dstrain.engine.dataloader",
}

# Target modules that need a library the facade does not always have: the module's first name -> pip line.
_PROVIDERS = {"dstrain.pipe": "dspipe", "dstrain.moe": "dsmoe", f"{_C}.pipe": "dspipe", f"{_C}.moe": "dsmoe"}


class ModuleAlias(importlib.abc.Loader):
    """Loads a name as the module `target` (imported, or taken from sys.modules): one object, two names."""

    def __init__(self, target: str):
        self.target = target
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        try:
            module = importlib.import_module(self.target)
        except ModuleNotFoundError:
            library = next((lib for prefix, lib in _PROVIDERS.items() if self.target.startswith(prefix)), None)
            if library is not None:
                raise ModuleNotFoundError(f"{spec.name} (dstrain's {self.target}) needs the {library} library: "
                                          f"pip install {library}", name=spec.name) from None
            raise
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The target ran when it was imported. The import system has just stamped the alias's spec on it:
        # give it its own back, so its relative imports and reloads keep resolving where it lives.
        module.__spec__ = self._own_spec


class TableFinder(importlib.abc.MetaPathFinder):
    """Finds the names of `table` (exactly) as their target modules. With `prefixes`, a name under a key
    (`dstrain.moe.layer` under `dstrain.moe`) maps to the same place under its target. With `closed`,
    an unlisted name under `root` is an ImportError naming the table, instead of a search elsewhere."""

    def __init__(self, table: dict[str, str], root: str, *, prefixes: bool, closed: bool, table_name: str):
        self.table, self.root, self.prefixes, self.closed, self.table_name = table, root, prefixes, closed, table_name

    def target(self, fullname: str) -> str | None:
        if fullname in self.table:
            return self.table[fullname]
        if self.prefixes:
            for key, target in self.table.items():
                if fullname.startswith(key + "."):
                    return target + fullname[len(key):]
        return None

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        module = self.target(fullname)
        if module is None:
            if self.closed:
                raise ModuleNotFoundError(f"{fullname}: dstrain maps only the DeepSpeed modules listed in "
                                          f"{self.table_name} (the facade README has the table); this one has no "
                                          f"dstrain counterpart", name=fullname)
            return None
        # A target that is a package keeps its own __path__; a listed parent of listed children must be one.
        is_package = any(other.startswith(fullname + ".") for other in self.table)
        return importlib.machinery.ModuleSpec(fullname, ModuleAlias(module), is_package=is_package)


def deepspeed_finder() -> TableFinder:
    return TableFinder(MAPPED_PATHS, "deepspeed", prefixes=False, closed=True,
                       table_name="dstrain.compat.alias.MAPPED_PATHS")


def public_paths_finder() -> TableFinder:
    return TableFinder(PUBLIC_PATHS, "dstrain", prefixes=True, closed=False,
                       table_name="dstrain.compat.alias.PUBLIC_PATHS")
