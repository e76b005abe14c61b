"""`import dstrain.as_deepspeed`: the one line that makes an unchanged DeepSpeed script run on dstrain.

It registers an import hook that resolves `deepspeed` and the submodules scripts import
(`deepspeed.accelerator`, `deepspeed.pipe`, `deepspeed.runtime.lr_schedules`, ...) to dstrain's,
by the table `MAPPED_PATHS` (dstrain/compat/alias.py). A path outside the table is an ImportError
that says so. A path whose library is not installed (dspipe, dsmoe, ...) is an ImportError naming
the `pip install` line.

It never shadows a real DeepSpeed silently: where `deepspeed` is installed, importing this module
raises, unless DSTRAIN_SHADOW_DEEPSPEED=1 asks for the shadowing (then it warns once).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

from .compat.alias import MAPPED_PATHS, deepspeed_finder

SHADOW_ENV = "DSTRAIN_SHADOW_DEEPSPEED"
__all__ = ["MAPPED_PATHS", "SHADOW_ENV", "install", "installed", "real_deepspeed_installed"]


def installed() -> bool:
    """Whether this process already serves `deepspeed` from dstrain (this hook, or dstrain-deepspeed-compat's)."""
    return any(getattr(finder, "root", None) == "deepspeed" for finder in sys.meta_path)


def real_deepspeed_installed() -> bool:
    """Whether a DeepSpeed other than this alias can be imported (looked up without the hook)."""
    if installed():
        return False  # already aliased in this process (the check ran before)
    return importlib.util.find_spec("deepspeed") is not None


def install() -> None:
    """Register the hook (idempotent). Raises where a real DeepSpeed is installed, unless DSTRAIN_SHADOW_DEEPSPEED=1."""
    if installed():
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
    sys.meta_path.insert(0, deepspeed_finder())


install()
