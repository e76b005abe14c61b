"""What each policy answers: the calls ZeroOptimizer makes, so a new variant knows what to provide.

A group is a flat.FlatGroup or a units.Unit: params, layout, shard_rank, group, master, master_param,
separate_master, master_to_model(); checkpoints and fragments read those alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ..layout import Slot
    from ..optimizer import ZeroOptimizer


class Partition(Protocol):
    """What each rank holds."""

    partitions_parameters: bool  # the module's parameters live only in the shards (stage 3)
    shards_optimizer_state: bool  # masters and optimizer state are cut into shards (stages 1-3)
    whole_tensors: bool  # every rank holds every master tensor whole (stage 0)

    def build(self, zero: ZeroOptimizer, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
              group_settings: list[dict[str, Any]]) -> list[Any]: ...
    def master_from_model(self, group: Any) -> None: ...
    def parameter_bytes(self, groups: list[Any]) -> list[tuple[str, str, int]]: ...
    def settings(self) -> dict[str, int]: ...


class Reducer(Protocol):
    """Brings every group's gradient to its owner; built by a Reduction over the partition's groups."""

    holds_gradients_back: bool  # set_sync(False) keeps backward gradients local until finish_backward()

    def reduce(self) -> list[torch.Tensor]: ...  # this rank's reduced gradient shard per group
    def zero(self) -> None: ...
    def set_sync(self, enabled: bool) -> None: ...
    def finish_backward(self) -> None: ...
    def full_grad(self, index: int, slot: Slot, unscale: float) -> torch.Tensor: ...
    def grad_shard(self, index: int) -> torch.Tensor | None: ...  # reduced before the step; None: only at it
    def unused_parameters(self) -> list[str]: ...
    def settings(self) -> dict[str, int]: ...
    def buffer_bytes(self) -> int: ...
    def comm_buffer_bytes(self) -> int: ...


class Reduction(Protocol):
    def build(self, zero: ZeroOptimizer, groups: list[Any], average: bool) -> Reducer: ...


class Publish(Protocol):
    def publish(self, groups: list[Any]) -> None: ...


class NormScope(Protocol):
    def replicas(self, group: Any, default_group: Any) -> int: ...
    def is_local(self, groups: list[Any], process_group: Any, norm_group: Any) -> bool: ...


class SaveScope(Protocol):
    def saved_world(self, world: int) -> int: ...
    def writes(self, group: Any, node_local: bool) -> bool: ...
    def check_state(self, state: dict[str, Any], stage: int, world: int) -> None: ...
