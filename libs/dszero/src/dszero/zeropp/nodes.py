"""Which data-parallel ranks share a node, and the two process groups ZeRO++ builds on that split.

A node is `per_node` consecutive ranks of the data-parallel group (in its rank order), decided the
same way on every rank:
1. `zero_hpz_partition_size` when it is above 1: hpZ's secondary group is, by the reference, the
   ranks of one node;
2. else the `LOCAL_WORLD_SIZE` environment variable (processes per node: torchrun sets it, under dstrain's
   launcher too), counting only this data-parallel group's ranks among them;
3. else the whole group is one node.
One machine simulates nodes the same way: 4 ranks run as 2 "nodes" of 2 with zero_hpz_partition_size 2,
or with LOCAL_WORLD_SIZE=2 in each rank's environment (what torchrun sets on 2 machines of 2 processes).

The groups come from dscomm's layout: ParallelDims' "expert" groups of size `per_node` are exactly
`per_node` consecutive data ranks (a node) and its "expert_data" groups the ranks at the same place in
every node, created collectively once and cached by dscomm.groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

import dscomm

from ..errors import ZeroConfigError

LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"


@dataclass(frozen=True)
class NodeGroups:
    world: int  # data-parallel ranks
    per_node: int  # of which on one node
    node: int  # this rank's node
    local: int  # this rank's place in its node
    local_group: Any  # the ranks of this node, in data-parallel order
    across_group: Any  # one rank per node, the ones at this rank's place, ordered by node

    @property
    def nodes(self) -> int:
        return self.world // self.per_node


def ranks_per_node(group: Any, hpz_partition_size: int, environ: dict[str, str] | None = None) -> int:
    """How many ranks of the data-parallel `group` share a node (see the module doc for the order of sources)."""
    world = dist.get_world_size(group)
    if hpz_partition_size > 1:
        if world % hpz_partition_size:
            raise ZeroConfigError(f"zero_optimization.zero_hpz_partition_size = {hpz_partition_size} must divide the "
                                  f"data-parallel size {world}; valid: "
                                  f"{[d for d in range(1, world + 1) if world % d == 0]}")
        return hpz_partition_size
    environ = os.environ if environ is None else environ
    text = environ.get(LOCAL_WORLD_SIZE)
    if not text:
        return world
    try:
        local_world = int(text)
    except ValueError:
        local_world = 0
    if local_world < 1:
        raise ZeroConfigError(f"{LOCAL_WORLD_SIZE}={text!r} (processes per node, read for ZeRO++'s nodes) must be a "
                              f"positive integer")
    ranks = dscomm.groups.get_group_ranks(group)
    me = dist.get_rank()
    per_node = nodes_of(ranks, local_world)
    if per_node is None:
        raise ZeroConfigError(f"{LOCAL_WORLD_SIZE}={local_world}: the data-parallel ranks {ranks} of rank {me} do not "
                              f"fall into nodes of equal, consecutive runs; set zero_optimization."
                              f"zero_hpz_partition_size to the data-parallel ranks per node instead")
    return per_node


def nodes_of(ranks: list[int], local_world: int) -> int | None:
    """Data ranks per node when global ranks `ranks` sit `local_world` to a node in equal consecutive runs."""
    runs: list[int] = []
    previous = None
    for rank in ranks:
        node = rank // local_world
        if node != previous:
            runs.append(0)
            previous = node
        runs[-1] += 1
    if len(set(runs)) != 1 or len(runs) != len({r // local_world for r in ranks}):
        return None
    return runs[0]


def node_groups(group: Any, per_node: int) -> NodeGroups:
    """This rank's node and across-node groups (collective on every rank of the world, the first time)."""
    world = dist.get_world_size(group)
    data_group = dscomm.groups.get_data_parallel_group()
    ranks, data_ranks = dscomm.groups.get_group_ranks(group), dscomm.groups.get_group_ranks(data_group)
    if ranks != data_ranks:
        raise ZeroConfigError(f"ZeRO++ (zero_hpz_partition_size, zero_quantized_weights, zero_quantized_gradients) "
                              f"partitions over dscomm's data-parallel group (ranks {data_ranks}), but this optimizer's "
                              f"group is ranks {ranks}; register the layout with dscomm.groups.use(...) or leave "
                              f"the group argument out")
    rank = dist.get_rank(group)
    return NodeGroups(world=world, per_node=per_node, node=rank // per_node, local=rank % per_node,
                      local_group=dscomm.groups.get_expert_parallel_group(per_node),
                      across_group=dscomm.groups.get_expert_data_parallel_group(per_node))
