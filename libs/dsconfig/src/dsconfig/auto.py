"""The one table that turns "auto" tuning knobs into numbers.

Hugging Face's Trainer writes "auto" into a DeepSpeed config and fills it in from the model and its
arguments. A plain script has no Trainer, so the knobs that only tune speed and memory get a number
here: Hugging Face's rule from the model's hidden size where there is one, the reference's default
otherwise. Every library that reads these keys takes them resolved from here, so no two places can
choose different numbers. Keys whose "auto" depends on the user's intent (fp16.enabled, the batch
sizes, an optimizer's learning rate) are not in the table and stay "auto" for the caller to refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from .fields import AUTO
from .sections import OffloadParamConfig, ZeroConfig

T = TypeVar("T")

# path -> Hugging Face's rule from the hidden size (None: always the reference default, the field's own).
RESOLVABLE: dict[str, Callable[[int], int] | None] = {
    "gradient_clipping": None,
    "zero_optimization.reduce_bucket_size": lambda hidden: hidden * hidden,
    "zero_optimization.stage3_prefetch_bucket_size": lambda hidden: int(0.9 * hidden * hidden),
    "zero_optimization.stage3_param_persistence_threshold": lambda hidden: 10 * hidden,
    "zero_optimization.allgather_bucket_size": None,
    "zero_optimization.stage3_max_live_parameters": None,
    "zero_optimization.stage3_max_reuse_distance": None,
    "zero_optimization.sub_group_size": None,
    "zero_optimization.offload_param.buffer_size": None,
}

_PREFIX = {ZeroConfig: "zero_optimization", OffloadParamConfig: "zero_optimization.offload_param"}


def resolve_auto(config: T, hidden_size: int | None = None) -> T:
    """`config` (a DeepSpeedConfig, ZeroConfig or OffloadParamConfig) with every resolvable "auto" a number.

    hidden_size: the model's hidden size, for Hugging Face's bucket rules; None uses the defaults.
    """
    return _resolve(config, _PREFIX.get(type(config), ""), hidden_size)


def _resolve(obj: Any, path: str, hidden_size: int | None) -> Any:
    if not attrs.has(type(obj)):
        return obj
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(obj)):
        if field.metadata.get("dsconfig_internal"):
            continue
        value = getattr(obj, field.name)
        where = f"{path}.{field.name}" if path else field.name
        if value == AUTO and where in RESOLVABLE:
            rule = RESOLVABLE[where]
            changes[field.name] = rule(hidden_size) if rule is not None and hidden_size else field.default
        elif attrs.has(type(value)):
            resolved = _resolve(value, where, hidden_size)
            if resolved is not value:
                changes[field.name] = resolved
    return attrs.evolve(obj, **changes) if changes else obj
