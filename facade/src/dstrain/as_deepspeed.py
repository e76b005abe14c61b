"""`import dstrain.as_deepspeed`: the one line that makes an unchanged DeepSpeed script run on dstrain.

It registers an import hook that resolves `deepspeed` and the submodules scripts import
(`deepspeed.accelerator`, `deepspeed.pipe`, `deepspeed.runtime.lr_schedules`, ...) to dstrain's,
by the table `MAPPED_PATHS`. A path outside the table is an ImportError that says so. A path whose
library is not installed (dspipe, dsmoe, ...) is an ImportError naming the `pip install` line.

It never shadows a real DeepSpeed silently: where `deepspeed` is installed, importing this module
raises, unless DSTRAIN_SHADOW_DEEPSPEED=1 asks for the shadowing (then it warns once).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from types import ModuleType

# deepspeed.<path> -> the module that provides it. Every entry is importable where its library is installed.
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

# Target modules that need a library the facade does not always have: the module's first name -> pip line.
_PROVIDERS = {"dstrain.pipe": "dspipe", "dstrain.moe": "dsmoe"}
SHADOW_ENV = "DSTRAIN_SHADOW_DEEPSPEED"


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        try:
            return importlib.import_module(self.target)
        except ModuleNotFoundError:
            library = next((lib for prefix, lib in _PROVIDERS.items() if self.target.startswith(prefix)), None)
            if library is not None:
                raise ModuleNotFoundError(f"{spec.name} (dstrain's {self.target}) needs the {library} library: "
                                          f"pip install {library}", name=spec.name) from None
            raise

    def exec_module(self, module: ModuleType) -> None:
        pass  # the target module ran when it was imported


class DeepSpeedAliasFinder(importlib.abc.MetaPathFinder):
    """Finds `deepspeed[.x]` as the dstrain module of MAPPED_PATHS."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "deepspeed" and not fullname.startswith("deepspeed."):
            return None
        module = MAPPED_PATHS.get(fullname)
        if module is None:
            raise ModuleNotFoundError(f"{fullname}: dstrain maps only the DeepSpeed modules listed in "
                                      f"dstrain.as_deepspeed.MAPPED_PATHS (the facade README has the table); this one "
                                      f"has no dstrain counterpart", name=fullname)
        is_package = any(other.startswith(fullname + ".") for other in MAPPED_PATHS)
        return importlib.machinery.ModuleSpec(fullname, _Alias(module), is_package=is_package)


def real_deepspeed_installed() -> bool:
    """Whether a DeepSpeed other than this alias can be imported (looked up without the hook)."""
    if any(isinstance(finder, DeepSpeedAliasFinder) for finder in sys.meta_path):
        return False  # already aliased in this process (the check ran before)
    return importlib.util.find_spec("deepspeed") is not None


def install() -> None:
    """Register the hook (idempotent). Raises where a real DeepSpeed is installed, unless DSTRAIN_SHADOW_DEEPSPEED=1."""
    if any(isinstance(finder, DeepSpeedAliasFinder) for finder in sys.meta_path):
        return
    if real_deepspeed_installed():
        if os.environ.get(SHADOW_ENV) != "1":
            raise ImportError(f"import dstrain.as_deepspeed: a real DeepSpeed is installed here, and the alias would "
                              f"shadow it. Uninstall it, import dstrain directly, or set {SHADOW_ENV}=1 to run this "
                              f"script on dstrain anyway")
        warnings.warn(f"dstrain.as_deepspeed: shadowing the installed DeepSpeed ({SHADOW_ENV}=1): `import deepspeed` "
                      f"gives dstrain", stacklevel=2)
        for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
            del sys.modules[name]
    sys.meta_path.insert(0, DeepSpeedAliasFinder())


install()
