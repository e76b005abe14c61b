"""Lazy imports of the optional backend packages, so `import dsmonitor` stays light."""

import importlib
from types import ModuleType

from .errors import MissingExtraError


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise an error naming the pip line that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs the '{module}' package, which is not installed "
            f'({exc}); install it with: pip install "dsmonitor[{extra}]"'
        ) from exc
