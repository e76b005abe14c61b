"""What a pass knows about the graph it rewrites, as plain data: which placeholders are ZeRO parameters
(and their stage-3 units), which outputs are gradients or saved activations, the memory budgets and the
profile measured so far. The backend fills it in; passes read it (selective gather and the offload
passes also note what they decided, for the runtime)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

FORWARD, BACKWARD, INFERENCE = "forward", "backward", "inference"


@dataclass(frozen=True)
class ParamSlot:
    """One ZeRO parameter as a graph sees it."""

    key: int  # the runtime's index of the parameter
    name: str  # its name in the module, for messages and logs
    shape: tuple[int, ...]
    unit: int | None = None  # stage 3: the key of its unit (None at stages 1 and 2)
    offset: int = 0  # stage 3: where it starts in its unit's flat weights
    persistent: bool = False  # stage 3: its unit stays gathered, so the graph reads the placeholder itself


@dataclass(frozen=True)
class UnitSlot:
    """A stage-3 unit: the flat weights one gather brings whole."""

    key: int
    numel: int  # padded, as gathered
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Budgets:
    """Bytes the scheduling passes may use (see README: where each comes from)."""

    prefetch_bytes: int = 0  # gathered ahead of their use, at any time (stage3_prefetch_bucket_size)
    live_bytes: int = 1 << 62  # gathered parameters at any time, kept ones included (stage3_max_live_parameters)
    reuse_bytes: int = 1 << 62  # a forward's unit stays gathered for backward if reused within this (max_reuse_distance)
    peak_bytes: int | None = None  # a graph's peak (kept units included) prefetch and selective gather stay within
    keep_margin: float = 0.1  # no peak_bytes given: kept units may add this much of the profiled step peak
    gathers_ahead: int = 2  # gathers in flight at once (double_buffer: 2, else 1)
    free_activation_bytes: int = 10 * 1024 * 1024  # compile.free_activation_threshold
    offload_activation_bytes: int = 5 * 1024 * 1024  # the reference's floor for an activation worth moving
    offload_activation_budget: int | None = None  # offload until the forward's peak is under this (None: all)
    long_context_min_seq_len: int = 4096  # long_context_checkpointing recomputes from this many tokens per rank


@dataclass
class Profile:
    """Measured on the steps before a schedule entry (every rank agrees on it: times are the ranks' maxima)."""

    gather_seconds: dict[int, float] = field(default_factory=dict)  # unit key -> one gather's time
    node_seconds: dict[int, dict[str, float]] = field(default_factory=dict)  # graph id -> node name -> time
    copy_bytes_per_second: float = 2e9  # host <-> device copies (measured when activations were offloaded)
    state_reload_seconds: float = 0.0  # bringing the optimizer states back (measured by offload_adam_states)


@dataclass
class GraphInfo:
    kind: str  # FORWARD, BACKWARD or INFERENCE
    runtime: int
    stage: int
    graph_id: int = 0
    params: dict[str, ParamSlot] = field(default_factory=dict)  # placeholder name -> parameter
    grad_outputs: dict[int, ParamSlot] = field(default_factory=dict)  # backward: output index -> its parameter
    units: dict[int, UnitSlot] = field(default_factory=dict)
    saved_activations: dict[int, str] = field(default_factory=dict)  # forward: output index -> saved activation
    activation_inputs: set[str] = field(default_factory=set)  # backward: placeholders that are saved activations
    offloaded: set[str] = field(default_factory=set)  # backward: activations the forward moved to host memory
    budgets: Budgets = field(default_factory=Budgets)
    profile: Profile | None = None
    kept_units: frozenset[int] = frozenset()  # units selective gather keeps gathered across steps
    first_graph: bool = True  # the step's first forward graph (offload_adam_states offloads there)
    decisions: dict[str, object] = field(default_factory=dict)  # what passes chose, for logs and tests

    def with_kind(self, kind: str, **changes) -> GraphInfo:
        return dataclasses.replace(self, kind=kind, **changes)

    def param_of(self, name: str) -> ParamSlot | None:
        return self.params.get(name)
