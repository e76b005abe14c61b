"""Is another DeepSpeed here? Asked at build time (setup.py, before this package installs) and at run time
(before `import deepspeed` is served from dstrain). Standard library only: it runs at interpreter start-up and
inside pip's build.

Two kinds, treated differently:
- an **installed** DeepSpeed leaves its metadata in a directory of the path (`deepspeed-<version>.dist-info`,
  `deepspeed.egg-info`, an editable install's `__editable__.deepspeed-*` hook): this package refuses to install
  or to work beside it;
- a **local** `deepspeed` module or package without metadata (a script's own `deepspeed.py`, a source tree on
  PYTHONPATH) is the script's own: `import deepspeed` is left to it, as dstrain's launcher leaves it, and no
  `deepspeed` distribution is announced. A folder named `deepspeed` without an `__init__.py` (a project's
  configs) is neither.
"""

from __future__ import annotations

import os
import sys

# Nothing heavier than os and sys at import (re, typing, collections cost milliseconds at every start-up).

# The metadata a DeepSpeed installation leaves in a site directory (names compared lower-cased).
_METADATA = r"^(deepspeed-[^/]+\.(dist-info|egg-info)|deepspeed\.egg-(info|link)|__editable__\.deepspeed-.+)$"


def installed_in(directories: list[str], packages: bool = False) -> str | None:
    """The first trace of an installed DeepSpeed in `directories`: its metadata, and with `packages` its package
    folder too (a site-packages directory holds nothing else named so)."""
    import re  # loaded by whoever asks for metadata (pip, importlib.metadata); not worth a start-up import

    metadata = re.compile(_METADATA)
    for directory in directories:
        try:
            names = sorted(os.listdir(directory or "."))
        except OSError:
            continue  # a missing entry of sys.path, a zip file, ...
        for name in names:
            path = os.path.join(directory or ".", name)
            if metadata.match(name.lower()):
                return path
            if packages and name == "deepspeed" and os.path.isfile(os.path.join(path, "__init__.py")):
                return path
    return None


def on_the_path() -> str | None:
    """Where Python's path finder would import a `deepspeed` module or package from (not a bare folder), or None.
    Only the path finder is asked: other meta-path finders may refuse to be asked (pip's, while it installs)."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("deepspeed", None)
    return spec.origin if spec is not None and spec.origin not in (None, "namespace") else None


def found_by_other_finders(skip: list[object]) -> str | None:
    """Where another sys.meta_path finder (not one of `skip`, nor one serving deepspeed from dstrain) would import
    `deepspeed` from (an editable install's own finder included), or None. Asked only while `deepspeed` is being
    imported."""
    skipped = {id(finder) for finder in skip}
    for finder in list(sys.meta_path):
        if id(finder) in skipped or getattr(finder, "root", None) == "deepspeed":
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec("deepspeed", None)
        except ImportError:
            continue
        if spec is not None and spec.origin not in (None, "namespace"):  # a folder named deepspeed is not DeepSpeed
            return spec.origin
    return None


def refusal(where: str, what: str) -> str:
    """The message for `what` (e.g. "import deepspeed") refused because DeepSpeed is installed at `where`."""
    return (f"{what}: a real DeepSpeed is installed ({where}) beside dstrain-deepspeed-compat, which serves "
            f"`import deepspeed` and the `deepspeed` commands from dstrain. The two cannot share an environment: "
            f"`pip uninstall dstrain-deepspeed-compat` to use DeepSpeed, or `pip uninstall deepspeed` to use "
            f"dstrain (DSTRAIN_SHADOW_DEEPSPEED=1 runs on dstrain anyway)")
