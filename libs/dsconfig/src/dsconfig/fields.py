"""How a config key is declared: its default, documentation, bounds and whether it may be "auto".

Types come from the attribute annotations; everything else is field metadata, read by the
validator (bounds), the schema generator (docs) and `unresolved_auto()`.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

AUTO = "auto"
Auto = Literal["auto"]  # HF-style placeholder that a launcher or integration fills in later

_META_KEY = "dsconfig"


@attrs.frozen
class FieldInfo:
    doc: str = ""
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    le: float | None = None  # inclusive upper bound
    # "auto" is a mode of its own here (resolved from the model at run time), not a placeholder
    # for a launcher to fill in, so unresolved_auto() does not list it.
    auto_is_mode: bool = False


def setting(default: Any, doc: str = "", *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, auto_is_mode: bool = False) -> Any:
    """A config key with a scalar (immutable) default."""
    return attrs.field(default=default, metadata={_META_KEY: FieldInfo(doc, ge, gt, le, auto_is_mode)})


def section(factory: Any, doc: str = "") -> Any:
    """A config key whose default is built fresh (a nested section, a list or a dict)."""
    return attrs.field(factory=factory, metadata={_META_KEY: FieldInfo(doc)})


def info(field: attrs.Attribute) -> FieldInfo:
    return field.metadata.get(_META_KEY, FieldInfo())
