"""The `deepspeed` distribution that `importlib.metadata` finds where this package is installed: its name,
its version (`<DeepSpeed API version>+dstrain.<this package's version>`, e.g. 0.19.8+dstrain.0.1.0, which
transformers' and Accelerate's version checks accept) and its top-level module. It owns no files: pip neither
lists nor uninstalls it; uninstalling dstrain-deepspeed-compat removes it."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

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


class DstrainDeepSpeed(importlib.metadata.Distribution):
    """DeepSpeed's distribution as dstrain provides it: metadata only."""

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return _METADATA
        if filename == "top_level.txt":
            return "deepspeed\n"
        if filename == "INSTALLER":
            return "dstrain-deepspeed-compat\n"
        return None  # no RECORD, no entry points, no requirements

    def locate_file(self, path: Any) -> Path:
        return Path(SITE_DIR, path)


def announced_distributions(finder: Any, context: Any) -> Any:
    """What the finder answers: the distribution, when the search covers this package's site directory (a search
    of other folders, as pip makes of a target, must not see it) and no other DeepSpeed is there: an installed
    one's metadata answers instead (and its import is refused), a local module is not dstrain's (startup.py).
    Only the path is looked at, never other import finders (pip's refuses to be asked while it installs)."""
    paths = getattr(context, "path", None)
    if paths is None or not any(_same_dir(entry, SITE_DIR) for entry in paths):
        return iter(())
    if not finder.shadowing() and (finder.installed_deepspeed() is not None or on_the_path() is not None):
        return iter(())
    return iter((DstrainDeepSpeed(),))


def _same_dir(entry: str, directory: str) -> bool:
    try:
        return entry == directory or os.path.samefile(entry or ".", directory)
    except OSError:
        return False
