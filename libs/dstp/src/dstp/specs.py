"""Partition rules: which parameters a rule covers and how it splits them (pure Python).

A rule is DeepSpeed's TPLayerSpec: regex `patterns` over parameter names, a `partition_type`
("column": split the output dimension, all-reduce the input gradient; "row": split the input
dimension, all-reduce the output; "skip": keep whole), and for fused weights a logical `shape` (at
most one -1, and at `partition_dim` either a count of equal sub-parameters or a list of their sizes)
whose `partition_dim` is split, so each rank keeps its slice of every sub-parameter (Q, K and V, or
gate and up). `model_types` limits a rule to some `config.model_type`s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import TensorParallelError

PartitionType = Literal["column", "row", "skip"]
PARTITION_TYPES = ("column", "row", "skip")
ShapeDim = int | tuple[int, ...]


@dataclass(frozen=True)
class LayerSpec:
    """One ordered rule. `source` says where it came from ("partition_config.layer_specs[0]",
    "preset llama", "base_model_tp_plan"), for reports and errors; `required`: a rule the user wrote,
    so a pattern of it that matches nothing is an error rather than a preset's unused alternative."""

    patterns: tuple[str, ...]
    partition_type: PartitionType = "column"
    shape: tuple[ShapeDim, ...] | None = None
    partition_dim: int | None = None
    model_types: tuple[str, ...] | None = None
    gather_output: bool = False  # column only: all-gather the output so every rank sees it whole
    grad_allreduce: bool = False  # skip only: replicated, but each rank's gradient is partial (summed)
    split_input: bool = False  # row only: the input arrives whole and the layer takes its slice
    packed: int = 0  # column only: the output dimension holds this many equal parts (HF "packed_colwise")
    reduce_output: bool = False  # on a module: all-reduce its output (HF "moe_tp_experts")
    source: str = "layer_specs"
    required: bool = False
    _compiled: tuple[re.Pattern, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        where = self.source
        if self.partition_type not in PARTITION_TYPES:
            raise TensorParallelError(f"{where}.partition_type = {self.partition_type!r}: must be one of "
                                      f"{', '.join(PARTITION_TYPES)}")
        if not self.patterns:
            raise TensorParallelError(f"{where}.patterns: needs at least one regular expression")
        compiled = []
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise TensorParallelError(f"{where}.patterns: {pattern!r} is not a valid regular expression "
                                          f"({exc})") from None
        object.__setattr__(self, "_compiled", tuple(compiled))
        if self.partition_dim is not None and self.shape is None:
            raise TensorParallelError(f"{where}.partition_dim = {self.partition_dim} is used only together with "
                                      f"shape (the logical view of a fused weight)")
        if self.shape is not None:
            _check_shape(self.shape, self.effective_partition_dim, where)

    @property
    def effective_partition_dim(self) -> int:
        """Where the split falls in `shape` (DeepSpeed's default: 0 for column, 1 for row)."""
        if self.partition_dim is not None:
            return self.partition_dim
        return 0 if self.partition_type == "column" else 1

    def matches(self, name: str, model_type: str | None) -> bool:
        if self.model_types and (model_type is None
                                 or model_type.lower() not in {t.lower() for t in self.model_types}):
            return False
        return any(p.match(name) for p in self._compiled)

    def matching_patterns(self, names: list[str]) -> dict[str, int]:
        """How many of `names` each pattern matches (model_types aside)."""
        return {p.pattern: sum(1 for n in names if p.match(n)) for p in self._compiled}

    def describe(self) -> str:
        text = self.partition_type
        if self.shape is not None:
            text += f" shape={list(_listed(self.shape))} dim={self.effective_partition_dim}"
        if self.packed:
            text += f" packed={self.packed}"
        if self.gather_output:
            text += " gather_output"
        if self.grad_allreduce:
            text += " grad_allreduce"
        if self.split_input:
            text += " split_input"
        return f"{text} ({self.source})"


def _listed(shape: tuple[ShapeDim, ...]) -> list[Any]:
    return [list(d) if isinstance(d, tuple) else d for d in shape]


def _check_shape(shape: tuple[ShapeDim, ...], dim: int, where: str) -> None:
    if not 0 <= dim < len(shape):
        raise TensorParallelError(f"{where}.partition_dim = {dim} is out of range for shape {_listed(shape)} "
                                  f"(valid: 0..{len(shape) - 1})")
    inferred = 0
    for index, size in enumerate(shape):
        if isinstance(size, tuple):
            if index != dim:
                raise TensorParallelError(f"{where}.shape = {_listed(shape)}: a list of sub-parameter sizes is "
                                          f"allowed only at partition_dim ({dim}), not at {index}")
            if not size or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in size):
                raise TensorParallelError(f"{where}.shape = {_listed(shape)}: sub-parameter sizes must be "
                                          f"positive integers")
        elif isinstance(size, bool) or not isinstance(size, int) or size == 0 or size < -1:
            raise TensorParallelError(f"{where}.shape = {_listed(shape)}: each dimension is a positive integer "
                                      f"or -1 (inferred)")
        elif size == -1:
            inferred += 1
    if inferred > 1:
        raise TensorParallelError(f"{where}.shape = {_listed(shape)}: at most one dimension may be -1")


def normalize_shape(shape: Any) -> tuple[ShapeDim, ...] | None:
    """JSON lists (nested one level for unequal sub-parameters) as the tuples LayerSpec holds."""
    if shape is None:
        return None
    return tuple(tuple(d) if isinstance(d, (list, tuple)) else d for d in shape)


def specs_from_config(partition_config: Any) -> list[LayerSpec]:
    """dsconfig's tensor_parallel.partition_config.layer_specs as LayerSpecs (each required)."""
    specs = []
    for index, spec in enumerate(partition_config.layer_specs if partition_config is not None else []):
        specs.append(LayerSpec(patterns=tuple(spec.patterns), partition_type=spec.partition_type,
                               shape=normalize_shape(spec.shape), partition_dim=spec.partition_dim,
                               model_types=tuple(spec.model_types) if spec.model_types else None,
                               source=f"tensor_parallel.partition_config.layer_specs[{index}]", required=True))
    return specs
