"""The passes by name, each a function `(graph, GraphInfo) -> graph`, with what it needs and provides.

A schedule names them as DeepSpeed's does ("zero3_compile", "prefetch", ...); a pass may also be any
callable of that signature (unconstrained). Contracts are checked per schedule entry: a pass needs
what an earlier pass of the same entry provides, and two conflicting passes never share an entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from ..graphinfo import GraphInfo
from .activations import free_activation, offload_activation
from .long_context import LongContextPlan, long_context_checkpointing
from .offload import offload_adam_states, offload_parameters, record_inputs
from .prefetch import prefetch
from .selective_gather import choose_kept_units, keep_budget, selective_gather
from .zero import add_gather_release, add_reduce, zero3_compile, zero12_compile

PassFn = Callable[[fx.Graph, GraphInfo], fx.Graph]

GATHER_RELEASE = "z3_gather_release"  # capability: stage-3 gathers and releases are in the graph
REDUCE = "reduce"  # capability: gradients are handed to ZeRO's reduction


@dataclass(frozen=True)
class Pass:
    fn: PassFn
    stages: frozenset[int] = frozenset({1, 2, 3})
    provides: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    conflicts: frozenset[str] = frozenset()
    doc: str = ""
    # A pass over AOT autograd's joint graph, run before the partition: (joint graph, min_seq_len, static input
    # indices) -> plan. Its `fn` leaves the partitioned graphs as they are.
    joint: Callable[..., Any] | None = None


def _partitioned_already(graph: fx.Graph, info: GraphInfo) -> fx.Graph:
    return graph  # a joint pass acted before the partition


_OFFLOADS = frozenset({"offload_parameters", "offload_adam_states", "offload_activation"})

REGISTRY: dict[str, Pass] = {
    "zero1_compile": Pass(zero12_compile, frozenset({1}), frozenset({REDUCE}),
                          doc="hand gradients to ZeRO-1's reduction"),
    "zero2_compile": Pass(zero12_compile, frozenset({2}), frozenset({REDUCE}),
                          doc="hand gradients to ZeRO-2's bucketed reduction"),
    "zero3_compile": Pass(zero3_compile, frozenset({3}), frozenset({GATHER_RELEASE, REDUCE}),
                          doc="gather, release and reduce-scatter ZeRO-3 units in the graph"),
    "prefetch": Pass(prefetch, frozenset({3}), requires=frozenset({GATHER_RELEASE}),
                     doc="start gathers early, within the prefetch budget"),
    "selective_gather": Pass(selective_gather, frozenset({3}), requires=frozenset({GATHER_RELEASE}),
                             doc="keep the costliest units gathered across steps, within the live budget"),
    "free_activation": Pass(free_activation, doc="free large activations after their last backward use"),
    "offload_activation": Pass(offload_activation, conflicts=_OFFLOADS - {"offload_activation"},
                               doc="move saved activations to host memory between forward and backward"),
    "offload_adam_states": Pass(offload_adam_states, frozenset({3}),
                                conflicts=(_OFFLOADS - {"offload_adam_states"}) | {"zero1_compile", "zero2_compile"},
                                doc="move optimizer states to host memory during forward and backward"),
    "offload_parameters": Pass(offload_parameters, frozenset({3}), requires=frozenset({GATHER_RELEASE}),
                               conflicts=_OFFLOADS - {"offload_parameters"},
                               doc="move parameter shards to host memory between their uses"),
    "long_context_checkpointing": Pass(_partitioned_already, joint=long_context_checkpointing,
                                       doc="recompute sequence-long activations in backward, keep attention"),
}

__all__ = ["GATHER_RELEASE", "REDUCE", "REGISTRY", "LongContextPlan", "Pass", "PassFn", "add_gather_release",
           "add_reduce", "choose_kept_units", "free_activation", "keep_budget", "long_context_checkpointing",
           "offload_activation", "offload_adam_states", "offload_parameters", "prefetch", "record_inputs",
           "selective_gather", "zero3_compile", "zero12_compile"]
