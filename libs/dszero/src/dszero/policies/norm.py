"""What a stage's gradient norm covers: how many ranks of the norm group hold each gradient value.

The norm is one all-reduce of every rank's squared sums over the norm group, so each group's sum is
divided by how many ranks hold the same values:
- `ReplicatedNorm`: every rank of a group holds its whole reduced gradient (stage 0): its group's
  size times its norm_replicas; with one plain group over the norm group no collective is needed.
- `ShardedNorm`: each rank holds its own shard (stages 1-3): its norm_replicas alone.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class ReplicatedNorm:
    def replicas(self, group: Any, default_group: Any) -> int:
        return getattr(group, "norm_replicas", 1) * dist.get_world_size(getattr(group, "group", default_group))

    def is_local(self, groups: list[Any], process_group: Any, norm_group: Any) -> bool:
        # Plain stage 0 over the norm group: every rank already holds the same reduced gradients.
        return norm_group is process_group and all(
            getattr(g, "group", process_group) is process_group and getattr(g, "norm_replicas", 1) == 1
            for g in groups)


class ShardedNorm:
    def replicas(self, group: Any, default_group: Any) -> int:
        return getattr(group, "norm_replicas", 1)

    def is_local(self, groups: list[Any], process_group: Any, norm_group: Any) -> bool:
        return False
