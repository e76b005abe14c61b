"""DeepSpeed's checkpoint inspectors (`deepspeed.checkpoint.DeepSpeedCheckpoint`, `ZeROCheckpoint`): what a
DeepSpeed checkpoint directory (one tag) holds, the degrees it was written at, and which of its files each rank
of a smaller target layout reads. Conversion scripts (Megatron-DeepSpeed's `checkpoint_reshaping`, universal
checkpoint tools) start from these. Every `.pt` file goes through the restricted unpickler, and each model-states
file is read once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CheckpointLoadError
from .constants import ARGS_KEY, CHECKPOINT_PARALLEL_DIMS, ITERATION_KEY, UNIVERSAL_CHECKPOINT_INFO
from .files import DeepSpeedFiles, scan
from .topology import Model3DDescriptor, descriptor_from_metadata
from .unpickler import load_pickle


def _zero_files_in_rank_order(files: DeepSpeedFiles) -> list[str]:
    """The ZeRO optimizer files, source rank `dp * mp_size + mp` first to last (what a reshape map indexes)."""
    mp_size = len({mp for mp, _ in files.optim})
    return [str(files.optim[(index % mp_size, index // mp_size)]) for index in range(len(files.optim))]


def _target(original: Model3DDescriptor, pp: int | None, tp: int | None, dp: int | None) -> Model3DDescriptor:
    return Model3DDescriptor(pp or original.pp_degree, tp or original.tp_degree, dp or original.dp_degree)


class ZeROCheckpoint:
    """The ZeRO optimizer files of a DeepSpeed checkpoint, and which of them each target rank reads."""

    def __init__(self, dir: str | Path, *, _files: DeepSpeedFiles | None = None,
                 _source: Model3DDescriptor | None = None):
        self.dir = str(dir)
        self._files = _files or scan(Path(dir))
        self.file_list = _zero_files_in_rank_order(self._files)
        self.src_3d = _source or DeepSpeedCheckpoint(dir).original_3d
        self.target_3d = self.src_3d
        self._map = self.src_3d.reshape(self.src_3d)

    def get_src_pp_degree(self) -> int:
        return self.src_3d.pp_degree

    def get_src_tp_degree(self) -> int:
        return self.src_3d.tp_degree

    def get_src_dp_degree(self) -> int:
        return self.src_3d.dp_degree

    def num_files(self) -> int:
        return len(self.file_list)

    def reshape(self, target_3d: Model3DDescriptor) -> None:
        """Read the files as `target_3d`'s ranks (ValueError when a degree would grow)."""
        self._map = self.src_3d.reshape(target_3d)
        self.target_3d = target_3d

    def get_files_for_rank(self, pp_index: int, tp_index: int, dp_index: int) -> list[str]:
        """The ZeRO files the target rank (pp_index, tp_index, dp_index) reads, in order."""
        ok, errors = self.target_3d.is_valid(pp_index, tp_index, dp_index)
        if not ok:
            raise IndexError(f"rank ({pp_index}, {tp_index}, {dp_index}) of {self.target_3d.get_desc()}: "
                             f"{'; '.join(errors)}")
        if not self.file_list:
            return []  # a checkpoint without ZeRO files (stage 0, or a pipeline's own optimizer states)
        return [self.file_list[i] for i in self._map[dp_index].get_data(pp_index, tp_index)]


class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint directory: its files, the degrees it was written at (`original_*_degree`) and the
    degrees it is read at (`pp_degree`, `tp_degree`, `dp_degree`: the arguments, else the original ones)."""

    def __init__(self, dir: str | Path, tp_degree: int | None = None, pp_degree: int | None = None,
                 dp_degree: int | None = None):
        self.dir = str(dir)
        self._files = scan(Path(dir))
        if not self._files.model:
            raise CheckpointLoadError(f"{dir}: no mp_rank_XX_model_states.pt file (a stage 0-2 or pipeline "
                                      f"checkpoint has one per model-parallel rank)")
        self.mp_rank_files = [str(self._files.model[rank]) for rank in sorted(self._files.model)]
        self.layer_files = {layer: {tp: str(path) for tp, path in sorted(by_tp.items())}
                            for layer, by_tp in sorted(self._files.layers.items())}
        self.zero_files = _zero_files_in_rank_order(self._files)
        self._model_states = [self._read_model_states(file) for file in self.mp_rank_files]
        self.model_state_metadata = [(file, {CHECKPOINT_PARALLEL_DIMS: state.get(CHECKPOINT_PARALLEL_DIMS)})
                                     for file, state in zip(self.mp_rank_files, self._model_states)]
        first_layer = min(self.layer_files) if self.layer_files else None
        self.original_3d = descriptor_from_metadata(
            self.mp_rank_files, len(self.zero_files), len(self.layer_files[first_layer]) if first_layer else 0,
            [meta for _, meta in self.model_state_metadata])
        self.target_3d = _target(self.original_3d, pp_degree, tp_degree, dp_degree)
        ok, errors = self.original_3d.can_reshape(self.target_3d)
        if not ok:
            raise CheckpointLoadError(f"{dir} was written at {self.original_3d.get_desc()} and cannot be read at "
                                      f"{self.target_3d.get_desc()}: {'; '.join(errors)}")
        self.zero_checkpoint = ZeROCheckpoint(dir, _files=self._files, _source=self.original_3d)
        if self.zero_files:
            self.zero_checkpoint.reshape(self.target_3d)

    @staticmethod
    def _read_model_states(file: str) -> dict:
        state = load_pickle(file)
        if not isinstance(state, dict):
            raise CheckpointLoadError(f"{file}: a model-states file holds a dict, not {type(state).__name__}")
        return state

    original_pp_degree = property(lambda self: self.original_3d.pp_degree)
    original_tp_degree = property(lambda self: self.original_3d.tp_degree)
    original_dp_degree = property(lambda self: self.original_3d.dp_degree)
    pp_degree = property(lambda self: self.target_3d.pp_degree)
    tp_degree = property(lambda self: self.target_3d.tp_degree)
    dp_degree = property(lambda self: self.target_3d.dp_degree)

    def is_change_pp_degree(self) -> bool:
        return self.pp_degree != self.original_pp_degree

    def is_change_tp_degree(self) -> bool:
        return self.tp_degree != self.original_tp_degree

    def is_change_dp_degree(self) -> bool:
        return self.dp_degree != self.original_dp_degree

    def get_checkpoint_info(self, info_key: str = UNIVERSAL_CHECKPOINT_INFO) -> Any:
        """A key of the first model-states file (None when absent)."""
        return self._model_states[0].get(info_key)

    def get_iteration(self) -> Any:
        return self._model_states[0].get(ITERATION_KEY, 0)

    def get_args(self) -> Any:
        return self._model_states[0].get(ARGS_KEY)

    def get_zero_files(self, pp_index: int, tp_index: int, dp_index: int) -> list[str]:
        """The ZeRO optimizer files the target rank reads."""
        return self.zero_checkpoint.get_files_for_rank(pp_index, tp_index, dp_index)

    def get_layer_files(self, layer_id: int) -> list[str]:
        """A pipeline layer's files, one per source tensor rank."""
        if layer_id not in self.layer_files:
            raise KeyError(f"{self.dir} has no files of layer {layer_id}; its layers: {sorted(self.layer_files)}")
        return list(self.layer_files[layer_id].values())


__all__ = ["DeepSpeedCheckpoint", "ZeROCheckpoint"]
