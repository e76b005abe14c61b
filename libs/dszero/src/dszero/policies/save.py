"""What a stage's checkpoint holds, and which ranks write it.

- `SaveWhole`: every rank holds every group whole (stage 0): the group's first rank writes it (and,
  with node-local storage, every node's local rank 0), recorded at world size 1.
- `SaveShards`: every rank writes its own shards (stages 1-3), recorded at the data-parallel size.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

import dscomm

from ..errors import ZeroError


class _Saves:
    def saved_world(self, world: int) -> int:
        raise NotImplementedError

    def check_state(self, state: dict[str, Any], stage: int, world: int) -> None:
        """A state_dict() loads only into the stage and world size it was taken at (dszero.save / load reshard)."""
        expected = self.saved_world(world)
        if state.get("world_size") != expected or state.get("zero_stage") != stage:
            raise ZeroError(f"state_dict is for stage {state.get('zero_stage')} at world size {state.get('world_size')}; "
                            f"this optimizer is stage {stage} at {expected}: use dszero.save / dszero.load to "
                            f"change world size")


class SaveWhole(_Saves):
    def saved_world(self, world: int) -> int:
        return 1

    def writes(self, group: Any, node_local: bool) -> bool:
        return dist.get_rank(group.group) == 0 or (node_local and dscomm.get_local_rank() == 0)


class SaveShards(_Saves):
    def saved_world(self, world: int) -> int:
        return world

    def writes(self, group: Any, node_local: bool) -> bool:
        return True
