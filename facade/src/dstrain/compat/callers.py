"""Who asked for a DeepSpeed API that dstrain lacks: the error then names the API, the package that asked and
its version (and line), so a newer transformers or Accelerate whose integration calls something new fails with
"transformers 5.30.0 (transformers/integrations/deepspeed.py:412) asks for deepspeed.zero.Foo; ..." rather
than an AttributeError deep inside it.

Standard library only: the alias finder (alias.py) uses it before torch loads.
"""

from __future__ import annotations

import functools
import os
import sys

# The versions dstrain's tests run the integrations with (deepspeed-compat/tests): named in every such error.
VERIFIED = {"transformers": "5.24", "accelerate": "1.15"}

# Frames of these top-level packages are never "the caller": dstrain's own, and the import machinery's.
_OURS = {"dstrain", "dszero", "dscomm", "dsconfig", "dsaio", "dsmonitor", "dspipe", "dsmoe", "dstp", "dsdata",
         "dstrain_deepspeed_compat", "importlib", "_frozen_importlib", "_frozen_importlib_external", "builtins"}


def caller() -> tuple[str, str | None, str] | None:
    """(package, its version or None, "<file>:<line>") for the innermost frame outside dstrain, the import
    machinery and the script itself (__main__); None when there is none. The version is None for a module that
    belongs to no installed distribution (an application's own package)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        root = module.split(".", 1)[0]
        if root and root not in _OURS and root != "__main__":
            return root, _version(root), f"{_short(frame.f_code.co_filename, root)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def missing(api: str) -> str:
    """The message for a DeepSpeed `api` (e.g. "deepspeed.runtime.foo", "engine.bar") dstrain does not provide:
    the API, dstrain's version, and who asked (with its version and line)."""
    from .._version import __version__

    return f"{api}: dstrain {__version__}, which serves `import deepspeed`, does not provide it{asked_by()}"


def asked_by() -> str:
    """" (asked by transformers 5.30.0 at transformers/integrations/deepspeed.py:412; ...)" naming the package
    that asked and, for the integrations dstrain is verified with, the verified release; "" for a script."""
    asker = caller()
    if asker is None:
        return ""
    package, version, where = asker
    text = f" (asked by {package} {version} at {where}" if version else f" (asked by {package} at {where}"
    if package in VERIFIED:
        text += (f"; dstrain's {package} integration is verified with {package} {VERIFIED[package]}, and a newer "
                 f"release may call DeepSpeed APIs dstrain lacks: use {package} {VERIFIED[package]}, or report the API")
    return text + ")"


@functools.cache  # a distribution's version does not change within a process
def _version(package: str) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - the standard library always has it
        return None
    try:
        return version(package)
    except (PackageNotFoundError, ValueError):
        return None


def _short(path: str, root: str) -> str:
    """The file from its package's folder on (transformers/integrations/deepspeed.py), else its name."""
    parts = path.split(os.sep)
    return os.sep.join(parts[len(parts) - 1 - parts[::-1].index(root):]) if root in parts else os.path.basename(path)
