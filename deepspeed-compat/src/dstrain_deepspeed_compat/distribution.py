"""The `deepspeed` distribution that `importlib.metadata` finds where this package is installed: its name,
its version (`<DeepSpeed API version>+dstrain.<this package's version>`, e.g. 0.19.8+dstrain.0.1.0, which
transformers' and Accelerate's version checks accept) and its top-level module. It owns no files: pip lists it
but cannot uninstall it; uninstalling dstrain-deepspeed-compat removes it.

Imported at start-up with the hook, and light: the Distribution class is made on the first metadata query,
from `importlib.metadata` (loaded by then, since it is the one asking). A query must import nothing new: pip
refuses any import while it installs packages, and it asks for metadata then.
"""

from __future__ import annotations

import os

from ._version import DEEPSPEED_API_VERSION, __version__
from .real_deepspeed import on_the_path

VERSION = f"{DEEPSPEED_API_VERSION}+dstrain.{__version__}"
SITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where this package is installed

_METADATA = f"""Metadata-Version: 2.1
Name: deepspeed
Version: {VERSION}
Summary: DeepSpeed's API served by dstrain (announced by dstrain-deepspeed-compat {__version__})
Home-page: https://www.deepspeed.ai
"""
_FILES = {"METADATA": _METADATA, "PKG-INFO": _METADATA, "top_level.txt": "deepspeed\n",
          "INSTALLER": "dstrain-deepspeed-compat\n"}  # no RECORD, no entry points, no requirements

_made: list[type] = []


def distribution_class() -> type:
    """DeepSpeed's distribution as dstrain provides it: metadata only (an importlib.metadata.Distribution)."""
    if not _made:
        import importlib.metadata
        import pathlib

        class DstrainDeepSpeed(importlib.metadata.Distribution):
            def read_text(self, filename: str) -> str | None:
                return _FILES.get(filename)

            def locate_file(self, path: object) -> pathlib.Path:
                return pathlib.Path(SITE_DIR, str(path))

        _made.append(DstrainDeepSpeed)
    return _made[0]


def announced_distributions(finder: object, context: object) -> object:
    """What the finder answers: the distribution, when the search covers this package's site directory (a search
    of other folders, as pip makes of a target, must not see it) and no other DeepSpeed is there: an installed
    one's metadata answers instead (and its import is refused), a local module is not dstrain's (startup.py).
    Only the path is looked at, never other import finders (pip's refuses to be asked while it installs)."""
    paths = getattr(context, "path", None)
    if paths is None or not any(_same_dir(entry, SITE_DIR) for entry in paths):
        return iter(())
    if not finder.shadowing() and (finder.installed_deepspeed() is not None or on_the_path() is not None):
        return iter(())
    return iter((distribution_class()(),))


def _same_dir(entry: str, directory: str) -> bool:
    try:
        return entry == directory or os.path.samefile(entry or ".", directory)
    except OSError:
        return False
