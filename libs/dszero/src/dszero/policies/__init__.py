"""A ZeRO stage as a choice of policies, made once, here (`for_stage`).

    partition   what each rank holds (partition.py)
    reduction   how gradients reach their owners (reduction.py)
    publish     how updated weights reach the model (publish.py)
    norm        what the gradient norm counts (norm.py)
    save        what a checkpoint holds and who writes it (save.py)

| stage | partition                   | reduction                 | publish      | norm       | save       |
|-------|-----------------------------|---------------------------|--------------|------------|------------|
| 0     | FlatGroups (whole)          | ReduceAtStep (all-reduce) | KeepWhole    | Replicated | SaveWhole  |
| 1     | FlatGroups (sharded)        | ReduceAtStep (scatter)    | GatherShards | Sharded    | SaveShards |
| 2     | FlatGroups (sharded)        | ReduceInBuckets           | GatherShards | Sharded    | SaveShards |
| 3     | PartitionedUnits            | ReduceEachUnit            | RefreshUnits | Sharded    | SaveShards |

ZeroOptimizer reads a step as a sequence over these and never asks which stage it runs; another
variant of ZeRO (a compiled schedule over stage 3's units, say) is one more row.
"""

from __future__ import annotations

import attrs

from ..errors import ZeroConfigError
from .norm import ReplicatedNorm, ShardedNorm
from .partition import FlatGroups, PartitionedUnits
from .protocols import NormScope, Partition, Publish, Reducer, Reduction, SaveScope
from .publish import GatherShards, KeepWhole, RefreshUnits
from .reduction import ReduceAtStep, ReduceEachUnit, ReduceInBuckets
from .save import SaveShards, SaveWhole

__all__ = ["NormScope", "Partition", "Publish", "Reducer", "Reduction", "SaveScope", "StagePolicies", "for_stage"]


@attrs.frozen
class StagePolicies:
    stage: int
    partition: Partition
    reduction: Reduction
    publish: Publish
    norm: NormScope
    save: SaveScope


def for_stage(stage: int) -> StagePolicies:
    """The policies of ZeRO stage `stage` (fresh objects: a partition keeps what it built)."""
    if stage == 0:
        return StagePolicies(0, FlatGroups(sharded=False), ReduceAtStep(scatter=False), KeepWhole(), ReplicatedNorm(),
                             SaveWhole())
    if stage == 1:
        return StagePolicies(1, FlatGroups(sharded=True), ReduceAtStep(scatter=True), GatherShards(), ShardedNorm(),
                             SaveShards())
    if stage == 2:
        return StagePolicies(2, FlatGroups(sharded=True), ReduceInBuckets(), GatherShards(), ShardedNorm(),
                             SaveShards())
    if stage == 3:
        units = PartitionedUnits()
        return StagePolicies(3, units, ReduceEachUnit(units), RefreshUnits(), ShardedNorm(), SaveShards())
    raise ZeroConfigError(f"zero_optimization.stage = {stage!r}; valid: 0, 1, 2, 3")
