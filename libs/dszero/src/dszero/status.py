"""DeepSpeed's `ZeroParamStatus`: whether a partitioned parameter's whole value is on this rank now.

Every parameter of a stage-3 unit (built by `dszero.Init` or by a stage-3 `ZeroOptimizer`) carries
`param.ds_status` (kept current as the unit is gathered and released) and `param.ds_id` (a number unique in
the process), as DeepSpeed's do: code written for DeepSpeed (DeepSpeed-Chat's `_z3_params_to_fetch`) tests
`hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE` to decide what to gather.
"""

from __future__ import annotations

import itertools
from enum import Enum


class ZeroParamStatus(Enum):
    AVAILABLE = 1  # gathered: the whole value is here
    NOT_AVAILABLE = 2  # partitioned: only this rank's shard is here (the parameter is an empty tensor)
    INFLIGHT = 3  # an asynchronous gather (prefetch) is filling it


_ids = itertools.count()


def next_param_id() -> int:
    return next(_ids)
