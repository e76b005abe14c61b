"""A PipelineModule's weights as one file per layer, named as DeepSpeed names them
(`layer_XX-model_states<suffix>`, XX the global layer index). A layer's file does not depend on which
stage held it, so weights saved at one number of stages load at any other.

The files are written by a checkpoint engine, as in DeepSpeed: any object with `save(state_dict, path)`
and `load(path) -> state_dict` (and optionally `suffix`, default ".pt"). dspipe depends on no file
format; dstrain passes one over dsaio's safetensors files (never unpickled).

Data rank 0 of each stage writes that stage's layers; every rank reads its own. When the layout has
tensor-parallel ranks, each holds its own cut of a layer, so data rank 0 of every tensor rank writes
its cut, named as DeepSpeed names it (`layer_XX-model_YY-model_states<suffix>`, YY the tensor rank),
and each tensor rank reads its own. A tied module is written under each layer index that uses it,
and after a load the copies are made equal from the lowest rank holding one, as at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from .errors import PipelineError

if TYPE_CHECKING:
    from .module import PipelineModule



@runtime_checkable
class CheckpointEngine(Protocol):
    """Writes and reads one state dict per file (DeepSpeed's checkpoint_engine shape)."""

    def save(self, state_dict: dict[str, torch.Tensor], path: Path) -> None: ...

    def load(self, path: Path) -> dict[str, torch.Tensor]: ...


def layer_file(directory: Any, layer_idx: int, engine: Any = None, tensor_rank: int | None = None) -> Path:
    """`directory/layer_XX-model_states<suffix>`, or `layer_XX-model_YY-model_states<suffix>` for tensor rank YY
    of a tensor-parallel layout (DeepSpeed's names; the suffix is the engine's)."""
    model = "" if tensor_rank is None else f"-model_{tensor_rank:02d}"
    return Path(directory) / f"layer_{layer_idx:02d}{model}-model_states{getattr(engine, 'suffix', '.pt')}"


def module_layer_file(module: PipelineModule, directory: Any, layer_idx: int, engine: Any = None) -> Path:
    """The file `module`'s rank writes and reads for layer `layer_idx` (its tensor rank's cut, when the
    layout has tensor-parallel ranks)."""
    tensor_rank = module.dims.coords(module.global_rank).tensor if module.dims.tensor > 1 else None
    return layer_file(directory, layer_idx, engine, tensor_rank)


def _engine(engine: Any, what: str) -> CheckpointEngine:
    if not isinstance(engine, CheckpointEngine):
        raise PipelineError(f"{what} needs a checkpoint engine: an object with save(state_dict, path) and load(path) "
                            f"(got {type(engine).__name__}); dstrain's engine passes one over dsaio")
    return engine


def writes_layers(module: PipelineModule) -> bool:
    """Whether this rank writes its stages' layer files (one writer per stage and tensor rank)."""
    return module.dims.coords(module.global_rank).data == 0


def save_layers(module: PipelineModule, directory: Any, engine: Any, *,
                exclude_frozen_params: bool = False) -> list[Path]:
    """Write this rank's layer files when it is its stage's writer; returns the files written."""
    engine = _engine(engine, "save_state_dict")
    if not writes_layers(module):
        return []
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for index, func in module.local_layers():
        layer = _state_holder(func)
        if layer is None:
            continue
        state = layer.state_dict()
        if exclude_frozen_params:
            frozen = {name for name, p in layer.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        path = module_layer_file(module, directory, index, engine)
        engine.save({k: v.detach().contiguous() for k, v in state.items()}, path)
        written.append(path)
    return written


def load_layers(module: PipelineModule, directory: Any, engine: Any, *, strict: bool = True) -> None:
    """Load every layer this rank holds from `directory`, then re-synchronise the tied weights."""
    engine = _engine(engine, "load_state_dir")
    directory = Path(directory)
    for index, func in module.local_layers():
        layer = _state_holder(func)
        if layer is None:
            continue
        path = module_layer_file(module, directory, index, engine)
        if not path.is_file():
            saved = sorted(p.name for p in directory.glob("layer_*-model_states*")) if directory.is_dir() else []
            raise PipelineError(f"rank {module.global_rank}: no weights for layer {index} ({path.name}) in {directory}; "
                                f"layer files there: {', '.join(saved[:8]) or 'none'}"
                                f"{' ...' if len(saved) > 8 else ''}")
        state = engine.load(path)
        if not isinstance(state, dict):
            raise PipelineError(f"{path}: the checkpoint engine returned a {type(state).__name__}, not a state dict")
        _check_shapes(layer, state, path)
        try:
            layer.load_state_dict(state, strict=strict)
        except RuntimeError as exc:  # missing or unexpected keys under strict loading
            raise PipelineError(f"{path} does not fit layer {index} ({type(layer).__name__}): {exc} "
                                f"(load_state_dir(strict=False) loads the keys that match)") from None
    module.synchronize_tied_weights()


def _check_shapes(layer: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    current = layer.state_dict()
    for name, value in state.items():
        if name in current and tuple(current[name].shape) != tuple(value.shape):
            raise PipelineError(f"{path}: {name} has shape {tuple(value.shape)} in the file but "
                                f"{tuple(current[name].shape)} in the layer ({type(layer).__name__})")


def _state_holder(func: Any) -> torch.nn.Module | None:
    """The module whose state a layer saves (the tied module behind a forward_fn), or None for a function."""
    from functools import partial

    if isinstance(func, partial) and func.args and isinstance(func.args[0], torch.nn.Module):
        return func.args[0]
    return func if isinstance(func, torch.nn.Module) else None
