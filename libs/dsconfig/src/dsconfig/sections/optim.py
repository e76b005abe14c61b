"""The `optimizer` and `scheduler` sections: a type name and the constructor's parameters."""

from typing import Any

import attrs

from ..fields import FieldInfo, section


@attrs.frozen
class OptimizerConfig:
    type: str = attrs.field(metadata={"dsconfig": FieldInfo("Adam, AdamW, Lamb, Muon, or a torch.optim class name.")})
    params: dict[str, Any] = section(dict, "Keyword arguments of the optimizer's constructor.")


@attrs.frozen
class SchedulerConfig:
    type: str = attrs.field(metadata={"dsconfig": FieldInfo(
        "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, or a torch scheduler class name.")})
    params: dict[str, Any] = section(dict, "Keyword arguments of the scheduler's constructor.")
