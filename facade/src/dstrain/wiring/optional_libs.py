"""The middle-row libraries (dspipe, dsmoe, dstp, dsdata, dsseq) are optional: the facade installs and trains
with dsconfig, dscomm, dsaio, dsmonitor and dszero alone, and imports a middle-row library only where a
config or model uses its feature.

A config key that turns a missing library's feature on is refused by feature_gate (naming the key and
the library); a script that imports a public module re-exporting one (dstrain.pipe, dstrain.moe,
dstrain.runtime.domino) gets MissingLibraryError, an ImportError naming what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from ..errors import DstrainError

EXTRAS = {"dspipe": "pipe", "dsmoe": "moe", "dstp": "tp", "dsdata": "data", "dsseq": "seq"}  # library -> dstrain's extra


class MissingLibraryError(DstrainError, ImportError):
    """A feature needs a dstrain library that is not installed."""


def install_hint(library: str) -> str:
    extra = EXTRAS.get(library)
    also = f" (or `pip install 'dstrain[{extra}]'`)" if extra else ""
    return f"`pip install {library}`{also}"


def installed(library: str) -> bool:
    return library in sys.modules or importlib.util.find_spec(library) is not None


def imported(library: str) -> bool:
    """Whether `library` is imported: an object of its classes (an MoE layer, a tensor-parallel model)
    can exist only once it is, so an unimported library means a model without its feature."""
    return library in sys.modules


def require(module: str, what: str) -> ModuleType:
    """Import `module` (a library or one of its modules), or raise MissingLibraryError naming what needs
    it and how to install it."""
    library = module.partition(".")[0]
    if not installed(library):
        error = MissingLibraryError(f"{what} needs the {library} library, which is not installed: "
                                    f"{install_hint(library)}")
        error.name = library  # as ModuleNotFoundError names the module
        raise error
    return importlib.import_module(module)


class LazyLibrary:
    """A module bound at import time but imported on first attribute use (with require's error), so a
    wiring module imports without its library and fails only on a path that uses it."""

    def __init__(self, module: str, what: str):
        self._module = module
        self._what = what

    def __getattr__(self, attribute: str) -> Any:
        return getattr(require(self._module, self._what), attribute)

    def __repr__(self) -> str:
        return f"<lazy {self._module}>"
