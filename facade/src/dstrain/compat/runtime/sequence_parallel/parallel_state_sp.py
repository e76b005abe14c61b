"""`deepspeed.runtime.sequence_parallel.parallel_state_sp`: DeepSpeed's module-level sequence-parallel state,
answered from the layout registered with dscomm.groups (register_with_transformers, initialize()).

`initialize_sequence_parallel(n)` lays out the world with n consecutive sequence ranks and registers it;
the getters answer for whatever layout is registered. DeepSpeed's "model parallel" names alias the
sequence group here, as in DeepSpeed's module.
"""

from __future__ import annotations

import dscomm
from dscomm.groups import (
    get_sequence_data_parallel_group,
    get_sequence_data_parallel_rank,
    get_sequence_data_parallel_world_size,
    get_sequence_parallel_group,
    get_sequence_parallel_rank,
    get_sequence_parallel_world_size,
)

from ....errors import DstrainError


def initialize_sequence_parallel(sequence_parallel_size: int) -> None:
    """Lay out the world with `sequence_parallel_size` consecutive sequence ranks and register it (collective)."""
    if not dscomm.is_initialized():
        raise DstrainError("initialize_sequence_parallel: torch.distributed is not initialised; call "
                           "deepspeed.init_distributed() first")
    if not isinstance(sequence_parallel_size, int) or isinstance(sequence_parallel_size, bool) \
            or sequence_parallel_size < 2:
        raise DstrainError(f"initialize_sequence_parallel(sequence_parallel_size={sequence_parallel_size!r}): must "
                           f"be an integer greater than 1")
    world = dscomm.get_world_size()
    if world % sequence_parallel_size:
        raise DstrainError(f"initialize_sequence_parallel: the world of {world} ranks is not divisible by "
                           f"sequence_parallel_size {sequence_parallel_size}")
    dscomm.groups.use(dscomm.ParallelDims(world, sequence=sequence_parallel_size).build())


get_model_parallel_group = get_sequence_parallel_group
get_model_parallel_world_size = get_sequence_parallel_world_size
get_model_parallel_rank = get_sequence_parallel_rank

__all__ = ["get_model_parallel_group", "get_model_parallel_rank", "get_model_parallel_world_size",
           "get_sequence_data_parallel_group", "get_sequence_data_parallel_rank",
           "get_sequence_data_parallel_world_size", "get_sequence_parallel_group", "get_sequence_parallel_rank",
           "get_sequence_parallel_world_size", "initialize_sequence_parallel"]
