"""How a stage's updated weights reach the model, after a step or a load changed the masters.

The masters were already copied into this rank's part of the model (FlatGroup / Unit
.master_to_model); what is left is sharing it:
- `KeepWhole`: nothing; every rank updated every master itself (stage 0).
- `GatherShards`: every rank's shard all-gathered into the flat buffer the model reads (stages 1-2).
- `RefreshUnits`: units that stay gathered re-gathered; the others are gathered when next used (stage 3).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..wire import gather_shards


class KeepWhole:
    def publish(self, groups: list[Any]) -> None:
        pass


class GatherShards:
    def publish(self, groups: list[Any]) -> None:
        for flat in groups:
            if dist.get_world_size(flat.group) > 1:
                gather_shards(flat.model_flat, flat.model_shard(), flat.group, log_name="zero_allgather_params")


class RefreshUnits:
    def publish(self, groups: list[Any]) -> None:
        # Units that stay gathered show the new weights: every re-gather is launched, then each is waited for
        # (in the same order on every rank), so many small units' collectives do not each wait for the last.
        refreshing = [unit for unit in groups if unit.start_refresh()]
        for unit in refreshing:
            unit.gather()
