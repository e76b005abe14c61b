"""What `dstrain_deepspeed_compat.pth` runs when any Python of this environment starts: one finder on
`sys.meta_path` that serves `import deepspeed` from dstrain and gives `importlib.metadata` a `deepspeed`
distribution. Standard library only, and nothing else loads until a `deepspeed` name is asked for, so a
process that never touches DeepSpeed pays for one list insert.

- `import deepspeed` (and `deepspeed.<path>`) resolves through dstrain's alias table
  (`dstrain.compat.alias.MAPPED_PATHS`), loaded on the first such import.
- `importlib.metadata.version("deepspeed")` answers `<DeepSpeed API version>+dstrain.<version>`, which is what
  transformers and Accelerate look for before they enable their DeepSpeed integration.
- Where a real DeepSpeed is installed too (its metadata on the path), `import deepspeed` raises an ImportError
  saying so (unless DSTRAIN_SHADOW_DEEPSPEED=1) and the metadata is left to the real one. A `deepspeed`
  module of the script's own (no metadata: a deepspeed.py beside it, a source tree on PYTHONPATH) is left to
  Python, as dstrain's launcher leaves it, and no distribution is announced (real_deepspeed.py).
- DSTRAIN_DEEPSPEED_ALIAS=0 (the launcher's --no_deepspeed_alias) turns both off for a process.
"""

from __future__ import annotations

import os
import sys

from .distribution import announced_distributions
from .real_deepspeed import found_by_other_finders, installed_in, refusal

ALIAS_ENV = "DSTRAIN_DEEPSPEED_ALIAS"  # "0": leave `import deepspeed` and its metadata alone
SHADOW_ENV = "DSTRAIN_SHADOW_DEEPSPEED"  # "1": serve dstrain even beside a real DeepSpeed (as dstrain.as_deepspeed)


def _is_deepspeed(distribution_name: str) -> bool:
    # Names compare after collapsing [-_.] runs and case; "deepspeed" has no separator, so case is all.
    return distribution_name.lower() == "deepspeed"


class DeepSpeedFromDstrain:
    """The meta-path finder. While it serves `deepspeed` its `root` is "deepspeed", as on dstrain's own alias
    finder, so `dstrain.as_deepspeed` and the launcher see the alias is in place and add nothing; turned off
    (DSTRAIN_DEEPSPEED_ALIAS=0) it is None, and an explicit `import dstrain.as_deepspeed` installs dstrain's."""

    @property
    def root(self) -> str | None:
        return "deepspeed" if self.enabled() else None

    def __init__(self) -> None:
        self._table: object = None  # dstrain's alias finder, made on the first `deepspeed` import
        self._warned = False
        self._installed: tuple[object, str | None] = (None, None)  # (sys.path it was looked up on, the answer)

    @staticmethod
    def enabled() -> bool:
        return os.environ.get(ALIAS_ENV, "1") != "0"

    @staticmethod
    def shadowing() -> bool:
        return os.environ.get(SHADOW_ENV) == "1"

    def installed_deepspeed(self) -> str | None:
        """Where an installed DeepSpeed's metadata is on sys.path, or None. Looked up again only when sys.path
        changed: metadata enumerations ask often."""
        key = tuple(sys.path)
        if self._installed[0] != key:
            self._installed = (key, installed_in(sys.path))
        return self._installed[1]

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != "deepspeed" and not fullname.startswith("deepspeed."):
            return None
        if not self.enabled():
            return None
        if self._table is None:
            installed = self.installed_deepspeed()
            if installed is not None and not self.shadowing():
                raise ImportError(refusal(installed, "import deepspeed"), name="deepspeed")
            local = found_by_other_finders(skip=[self])
            if local is not None and not self.shadowing():
                return None  # the script's own deepspeed (no metadata): Python imports it, as dstrain's launcher leaves it
            if installed or local:
                self._warn_shadowing(installed or local)
            self._table = self._load_table()
        return self._table.find_spec(fullname, path, target)

    def _warn_shadowing(self, where: str) -> None:
        if not self._warned:
            import warnings

            self._warned = True
            warnings.warn(f"dstrain-deepspeed-compat: shadowing the DeepSpeed at {where} ({SHADOW_ENV}=1): "
                          f"`import deepspeed` gives dstrain", stacklevel=4)

    @staticmethod
    def _load_table() -> object:
        try:
            from dstrain.compat.alias import deepspeed_finder
        except ImportError as exc:
            raise ImportError(f"import deepspeed: dstrain-deepspeed-compat serves it from dstrain, which cannot be "
                              f"imported here ({exc}); pip install dstrain", name="deepspeed") from exc
        return deepspeed_finder()

    def find_distributions(self, context: object = None) -> object:
        """importlib.metadata's hook: the `deepspeed` distribution, where this finder serves `import deepspeed`."""
        name = getattr(context, "name", None)
        if name is not None and not _is_deepspeed(name):
            return iter(())  # the common case (every other package's version lookup): nothing to load
        if not self.enabled():
            return iter(())
        return announced_distributions(self, context)


def install() -> None:
    """Put the finder first on sys.meta_path (once per process)."""
    if not any(isinstance(finder, DeepSpeedFromDstrain) for finder in sys.meta_path):
        sys.meta_path.insert(0, DeepSpeedFromDstrain())
