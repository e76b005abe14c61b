"""The `optimizer` and `scheduler` sections: a type name and the constructor's parameters."""

from typing import Any

import attrs

from ..fields import section, setting


@attrs.frozen
class OptimizerConfig:
    type: str = setting("Adam", "Adam, AdamW, Lamb, Muon, or the name of a torch.optim class.")
    params: dict[str, Any] = section(dict, "Keyword arguments of the optimizer's constructor.")


@attrs.frozen
class SchedulerConfig:
    type: str = setting("WarmupLR", "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest or a torch scheduler.")
    params: dict[str, Any] = section(dict, "Keyword arguments of the scheduler's constructor.")
