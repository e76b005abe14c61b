"""Weights shared by layers on different pipeline ranks (TiedLayerSpec): which ranks hold a copy, the
process group joining them, the broadcast that makes the copies equal and the sum of their gradients.

A key's copies live on the ranks whose stages use it, one copy per rank (a rank holding two stages
that use it, as rank 0 of a V placement does, shares one module between them). Every pipeline
replica (data index, tensor index) has its own group, so tied gradients are summed within a replica
before the data-parallel reduction averages the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import dscomm
from dscomm import PIPELINE_TIED_ATTR, ParallelDims
from dscomm.parallel_groups import new_group

from .layers import tied_weight


@dataclass
class TiedGroup:
    """One tied key as this rank sees it: the global ranks holding a copy (lowest first), their
    process group (None when this rank holds the only copy) and the shared weights."""

    key: str
    ranks: list[int]
    group: Any
    weights: list[torch.nn.Parameter]

    @property
    def copies(self) -> int:
        return len(self.ranks)


def tie(keys_by_rank: dict[str, list[int]], modules: dict[str, torch.nn.Module], attrs: dict[str, list[str]],
        dims: ParallelDims, global_rank: int | None) -> dict[str, TiedGroup]:
    """Create the process groups of every tied key (collective: every rank creates every group, in sorted
    key order) and return this rank's TiedGroups. `keys_by_rank[key]`: the pipeline ranks using it."""
    groups: dict[str, TiedGroup] = {}
    distributed = dist.is_available() and dist.is_initialized()
    for key in sorted(keys_by_rank):
        pipe_ranks = sorted(set(keys_by_rank[key]))
        for data in range(dims.data):
            for tensor in range(dims.tensor):
                ranks = [dims.rank(p, data, tensor) for p in pipe_ranks]
                group = new_group(ranks) if distributed and len(ranks) > 1 else None
                if global_rank in ranks:
                    weights = [tied_weight(modules[key], path, key) for path in attrs[key]]
                    for weight in weights:
                        # dszero counts a weight held on several ranks once in the gradient norm.
                        setattr(weight, PIPELINE_TIED_ATTR, len(ranks))
                    groups[key] = TiedGroup(key, ranks, group, weights)
    return groups


def broadcast_tied(groups: dict[str, TiedGroup]) -> None:
    """Every copy of a tied weight takes the value of the copy on the lowest rank holding it."""
    with torch.no_grad():
        for tied in groups.values():
            if tied.group is None:
                continue
            for weight in tied.weights:
                dscomm.broadcast(weight.data, tied.ranks[0], group=tied.group, log_name="pipe_tied_broadcast")


def reduce_tied_grads(groups: dict[str, TiedGroup]) -> None:
    """Sum each tied weight's gradient over the ranks holding it (a missing gradient counts as zero)."""
    for tied in groups.values():
        if tied.group is None:
            continue
        for weight in tied.weights:
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            dscomm.all_reduce(weight.grad, group=tied.group, log_name="pipe_tied_grads")
