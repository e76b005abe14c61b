"""Which ranks of a DeepSpeed checkpoint (pipeline x tensor x data) a smaller run's ranks read: DeepSpeed's
`model_3d_desc` and `get_model_3d_descriptor`, pure arithmetic over rank numbers (plus one read of the
model-states files' recorded degrees).

A source rank is numbered `dp * (pp * tp) + (pp_index * tp + tp_index)`, as DeepSpeed numbers its ZeRO files.
Shrinking a degree merges neighbouring ranks: the tensor ranks of each pipeline stage are split into
`new_tp` contiguous runs, then the pipeline stages of each tensor column into `new_pp` runs, then every cell's
data-parallel copies into `new_dp` runs. Growing a degree is refused (the checkpoint has no finer split).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CheckpointLoadError
from .constants import CHECKPOINT_PARALLEL_DIMS, CHECKPOINT_PP_DEGREE, CHECKPOINT_TP_DEGREE

PP_DIM, TP_DIM, DP_DIM = "PP", "TP", "DP"


def split_evenly(items: list[int], parts: int) -> list[list[int]]:
    """`items` cut into `parts` contiguous runs of equal length (ValueError when they do not divide)."""
    if parts < 1 or len(items) % parts:
        raise ValueError(f"cannot split {len(items)} source ranks {items} into {parts} equal parts")
    size = len(items) // parts
    return [items[i * size:(i + 1) * size] for i in range(parts)]


class ParallelMap2D:
    """Source ranks per (pipeline index, tensor index) of a target layout."""

    def __init__(self, pp_degree: int, tp_degree: int):
        self.pp_degree, self.tp_degree = pp_degree, tp_degree
        self.map: dict[tuple[int, int], list[int]] = {}

    @classmethod
    def identity(cls, pp_degree: int, tp_degree: int) -> ParallelMap2D:
        made = cls(pp_degree, tp_degree)
        made.map = {(i // tp_degree, i % tp_degree): [i] for i in range(pp_degree * tp_degree)}
        return made

    def _check(self, pp_index: int | None, tp_index: int | None) -> None:
        for index, degree, name in ((pp_index, self.pp_degree, PP_DIM), (tp_index, self.tp_degree, TP_DIM)):
            if index is not None and not 0 <= index < degree:
                raise IndexError(f"{name} index {index} is outside 0..{degree - 1}")

    def add_data(self, pp_index: int, tp_index: int, data: list[int]) -> None:
        self._check(pp_index, tp_index)
        self.map.setdefault((pp_index, tp_index), []).extend(data)

    def get_data(self, pp_index: int | None = None, tp_index: int | None = None) -> list[int]:
        """The source ranks of one cell, or of a whole row / column / map (None: every index), in order."""
        self._check(pp_index, tp_index)
        pps = range(self.pp_degree) if pp_index is None else [pp_index]
        tps = range(self.tp_degree) if tp_index is None else [tp_index]
        return [rank for i in pps for j in tps for rank in self.map.get((i, j), [])]

    def __repr__(self) -> str:
        return f"ParallelMap2D(pp={self.pp_degree}, tp={self.tp_degree}, {self.map})"


def reshape_2d(old_pp: int, old_tp: int, new_pp: int, new_tp: int) -> ParallelMap2D:
    """The pipeline x tensor ranks of an (old_pp, old_tp) layout each (new_pp, new_tp) rank takes."""
    current = ParallelMap2D.identity(old_pp, old_tp)
    if new_tp != old_tp:
        merged = ParallelMap2D(old_pp, new_tp)
        for i in range(old_pp):
            for j, part in enumerate(split_evenly(current.get_data(pp_index=i), new_tp)):
                merged.add_data(i, j, part)
        current = merged
    if new_pp != old_pp:
        merged = ParallelMap2D(new_pp, current.tp_degree)
        for j in range(current.tp_degree):
            for i, part in enumerate(split_evenly(current.get_data(tp_index=j), new_pp)):
                merged.add_data(i, j, part)
        current = merged
    return current


class Model3DDescriptor:
    """The pipeline, tensor and data-parallel degrees of a checkpoint or a run (DeepSpeed's `model_3d_desc`)."""

    def __init__(self, pp_degree: int = 1, tp_degree: int = 1, dp_degree: int = 1):
        for name, value in (("pp_degree", pp_degree), ("tp_degree", tp_degree), ("dp_degree", dp_degree)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.pp_degree, self.tp_degree, self.dp_degree = pp_degree, tp_degree, dp_degree

    def get_desc(self) -> str:
        return f"{PP_DIM},{TP_DIM},{DP_DIM} = ({self.pp_degree}, {self.tp_degree}, {self.dp_degree})"

    def world_size(self) -> int:
        return self.pp_degree * self.tp_degree * self.dp_degree

    def is_valid(self, pp_index: int, tp_index: int, dp_index: int) -> tuple[bool, list[str]]:
        errors = [f"{name} indexing error: index {index} >= degree {degree}"
                  for index, degree, name in ((pp_index, self.pp_degree, PP_DIM), (tp_index, self.tp_degree, TP_DIM),
                                              (dp_index, self.dp_degree, DP_DIM)) if index >= degree]
        return not errors, errors

    def can_reshape(self, target: Model3DDescriptor) -> tuple[bool, list[str]]:
        """(whether `target` can read this checkpoint, why not): no degree may grow."""
        errors = [f"Expansion reshape not supported - {name}: {mine} ---> {theirs}"
                  for name, mine, theirs in ((PP_DIM, self.pp_degree, target.pp_degree),
                                             (TP_DIM, self.tp_degree, target.tp_degree),
                                             (DP_DIM, self.dp_degree, target.dp_degree)) if theirs > mine]
        return not errors, errors

    def reshape(self, target: Model3DDescriptor, verbose: bool = False) -> list[ParallelMap2D]:
        """For each target data-parallel rank, the source ranks each of its (pp, tp) cells reads."""
        ok, errors = self.can_reshape(target)
        if not ok:
            raise ValueError(f"cannot reshape {self.get_desc()} to {target.get_desc()}: {'; '.join(errors)}")
        cells = reshape_2d(self.pp_degree, self.tp_degree, target.pp_degree, target.tp_degree)
        stride = self.pp_degree * self.tp_degree
        per_dp = [ParallelMap2D(target.pp_degree, target.tp_degree) for _ in range(target.dp_degree)]
        for i in range(target.pp_degree):
            for j in range(target.tp_degree):
                with_copies = [rank + k * stride for rank in cells.get_data(i, j) for k in range(self.dp_degree)]
                for piece, part in zip(per_dp, split_evenly(with_copies, target.dp_degree)):
                    piece.add_data(i, j, part)
        return per_dp

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model3DDescriptor) and (self.pp_degree, self.tp_degree, self.dp_degree) == (
            other.pp_degree, other.tp_degree, other.dp_degree)

    def __repr__(self) -> str:
        return f"model_3d_desc({self.get_desc()})"


def _recorded_degrees(file: str, dimensions: Any) -> tuple[int, int]:
    if not isinstance(dimensions, dict):
        raise CheckpointLoadError(f"{file}: {CHECKPOINT_PARALLEL_DIMS} must be a dictionary, got {dimensions!r}")
    found = []
    for key in (CHECKPOINT_PP_DEGREE, CHECKPOINT_TP_DEGREE):
        value = dimensions.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointLoadError(f"{file}: {CHECKPOINT_PARALLEL_DIMS}.{key} must be a positive integer, got "
                                      f"{value!r}")
        found.append(value)
    return found[0], found[1]


def descriptor_from_metadata(model_files: list[str], zero_files: int, first_layer_files: int,
                             metadata: list[dict[str, Any]]) -> Model3DDescriptor:
    """The degrees a checkpoint was written at: recorded in its model-states files (every file the same), else
    (older checkpoints) counted: tensor ranks from the first pipeline layer's files, else from the model files."""
    recorded = [(file, meta.get(CHECKPOINT_PARALLEL_DIMS)) for file, meta in zip(model_files, metadata)]
    present = [(file, dims) for file, dims in recorded if dims is not None]
    if present:
        missing = [file for file, dims in recorded if dims is None]
        if missing:
            raise CheckpointLoadError(f"Checkpoint {CHECKPOINT_PARALLEL_DIMS} is missing from model-state files: "
                                      f"{missing}")
        degrees = {_recorded_degrees(file, dims) for file, dims in present}
        if len(degrees) != 1:
            raise CheckpointLoadError(f"Checkpoint {CHECKPOINT_PARALLEL_DIMS} disagrees across model-state files: "
                                      f"{sorted(degrees)}")
        pp, tp = degrees.pop()
        if len(model_files) != pp * tp:
            raise CheckpointLoadError(f"{len(model_files)} model-state files, but {CHECKPOINT_PARALLEL_DIMS} says "
                                      f"pp_degree {pp} x tp_degree {tp}")
        if zero_files % (pp * tp):
            raise CheckpointLoadError(f"{zero_files} ZeRO files do not divide among pp_degree {pp} x tp_degree {tp}")
        return Model3DDescriptor(pp, tp, max(1, zero_files // (pp * tp)))
    if first_layer_files:
        tp = first_layer_files
        pp = max(1, len(model_files) // tp)
    else:
        tp, pp = max(1, len(model_files)), 1
    return Model3DDescriptor(pp, tp, max(1, zero_files // (pp * tp)))


def get_model_3d_descriptor(directory: str | Path) -> Model3DDescriptor:
    """The degrees of the DeepSpeed checkpoint in `directory` (one tag's folder)."""
    from .inspect import DeepSpeedCheckpoint

    return DeepSpeedCheckpoint(directory).original_3d


__all__ = ["Model3DDescriptor", "ParallelMap2D", "descriptor_from_metadata", "get_model_3d_descriptor", "reshape_2d"]
