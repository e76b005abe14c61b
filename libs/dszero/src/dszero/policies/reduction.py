"""How a stage's gradients reach the ranks that own them: which reducer it builds over its groups.

- `ReduceAtStep`: gradients accumulate whole in a flat buffer and are reduced once, at the step;
  all-reduced when every rank keeps every master (stage 0), reduce-scattered when each keeps a
  shard (stage 1). reducers.FlatReducer.
- `ReduceInBuckets`: reduced during backward in buckets of `reduce_bucket_size`, each piece to its
  owner (stage 2). reducers.BucketReducer.
- `ReduceEachUnit`: each unit's gradient reduce-scattered as its backward ends, by the hooks that
  gather and release the units (stage 3). stage3.Stage3.

Every reducer answers the same calls (reduce, zero, set_sync, finish_backward, full_grad, grad_shard,
unused_parameters, settings, buffer_bytes, comm_buffer_bytes), so the optimizer never asks which.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..prefetch import PrefetchPlan
from ..reducers import BucketReducer, FlatReducer
from ..reuse import ReusePolicy
from ..stage3 import Stage3

if TYPE_CHECKING:
    from ..optimizer import ZeroOptimizer
    from .partition import PartitionedUnits

logger = logging.getLogger("dszero")


class ReduceAtStep:
    def __init__(self, scatter: bool):
        self.scatter = scatter  # reduce-scatter into shards (stage 1), else all-reduce (stage 0)

    def build(self, zero: ZeroOptimizer, groups: list[Any], average: bool) -> FlatReducer:
        return FlatReducer(groups, partition=self.scatter, average=average, comm_dtype=zero.communication_dtype,
                           accum_dtype=zero.grad_accum_dtype)


class ReduceInBuckets:
    def build(self, zero: ZeroOptimizer, groups: list[Any], average: bool) -> BucketReducer:
        grad_dtype = zero.grad_accum_dtype or zero.precision.torch_dtype
        return BucketReducer(groups, zero.config.reduce_bucket_size, zero.config.overlap_comm, average, grad_dtype,
                             wire_dtype=zero.communication_dtype)


class ReduceEachUnit:
    def __init__(self, partition: PartitionedUnits):
        self.partition = partition  # the units' homes say whether NVMe reads run ahead of the gathers

    def build(self, zero: ZeroOptimizer, units: list[Any], average: bool) -> Stage3:
        cfg = zero.config
        reuse = ReusePolicy(cfg.stage3_max_reuse_distance, cfg.stage3_max_live_parameters)
        built: list[Stage3] = []
        on_miss = _trace_miss_logger(zero.rank, built) if cfg.log_trace_cache_warnings else None
        prefetch = PrefetchPlan(cfg.stage3_prefetch_bucket_size, on_miss=on_miss)
        stage3 = Stage3(zero.module, units, zero.process_group, average, homes=self.partition.homes, reuse=reuse,
                        prefetch=prefetch, grad_dtype=zero.grad_accum_dtype, wire_dtype=zero.communication_dtype)
        built.append(stage3)
        return stage3


def _trace_miss_logger(rank: int, built: list[Stage3]):
    def log_trace_miss(key: int, forward: bool) -> None:
        """log_trace_cache_warnings: the module calls left the order recorded on the first step (the trace)."""
        if rank != 0:
            return
        unit = built[0].unit_by_key[key]
        logger.warning("zero stage 3: the %s of %s does not follow the module order recorded on the first step "
                       "(the trace cache); parameters are gathered on demand until the recorded order starts "
                       "again", "forward" if forward else "backward", unit.names[0].rsplit(".", 1)[0] or "the model")
    return log_trace_miss
