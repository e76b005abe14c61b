"""A universal checkpoint read whole: `read_universal(tag_dir) -> WholeCheckpoint`.

Every parameter's folder under zero/ gives its fp32 master and optimizer state, whole; the model-states
file gives the scheduler, counters, client state and the module's other entries (buffers, frozen
weights). Each parameter the model-states file lists (`param_shapes`) must have its folder, and every
file is read (through the restricted unpickler) and checked before anything is returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointLoadError
from ..contents import MASTER, WholeCheckpoint
from ..deepspeed.reader import DEEPSPEED_KEYS, loss_scaler_state
from ..deepspeed.unpickler import load_pickle
from .layout import FP32, MODEL_STATES, OPTIMIZER_STATE, PARAM, STEP, ZERO, ZERO3_MODEL_STATES

# A universal folder's universal_checkpoint_info describes its layout (the converter writes its version there):
# not the client's state, unlike a training checkpoint's, where a client (Megatron-DeepSpeed) keeps its own.
_LAYOUT_KEYS = DEEPSPEED_KEYS | {"universal_checkpoint_info"}
_SPLIT_MARKS = ("param_n_sub_params", "sub_param_shape", "sub_params_shape")  # Megatron's fused parameters


def read_universal(directory: str | Path) -> WholeCheckpoint:
    path = Path(directory)
    main_path = path / MODEL_STATES if (path / MODEL_STATES).is_file() else path / ZERO3_MODEL_STATES
    main = load_pickle(main_path)
    if not isinstance(main, dict):
        raise CheckpointLoadError(f"{main_path}: holds a {type(main).__name__}, not DeepSpeed's state dict")
    zero = path / ZERO
    optimizer = load_pickle(zero / OPTIMIZER_STATE) if (zero / OPTIMIZER_STATE).is_file() else {}
    if not isinstance(optimizer, dict):
        raise CheckpointLoadError(f"{zero / OPTIMIZER_STATE}: holds a {type(optimizer).__name__}, not a dict")
    parameters, scalars = _parameters(zero)
    _check_listed(main, parameters, zero, main_path)
    module = {str(k): v for k, v in (main.get("module") or {}).items() if torch.is_tensor(v) and v.numel() > 0}
    for name, entry in parameters.items():
        saved = (main.get("module") or {}).get(name)
        module[name] = entry[MASTER].to(saved.dtype if torch.is_tensor(saved) else torch.float32)
    steps = main.get("global_steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise CheckpointLoadError(f"{main_path}: 'global_steps' is {steps!r}, not a non-negative integer")
    progress = {k: main[k] for k in ("global_steps", "global_samples", "skipped_steps")
                if isinstance(main.get(k), int) and not isinstance(main.get(k), bool)}
    groups = optimizer.get("param_groups") or (optimizer.get("optimizer_state_dict") or {}).get("param_groups") or []
    return WholeCheckpoint(
        module=module, parameters=parameters, scalars=scalars,
        param_groups=[{k: v for k, v in g.items() if k != "params"} for g in groups if isinstance(g, dict)],
        lr_scheduler=main.get("lr_scheduler") if isinstance(main.get("lr_scheduler"), dict) else None,
        client_state={k: v for k, v in main.items() if k not in _LAYOUT_KEYS},
        progress=progress, loss_scaler=loss_scaler_state(optimizer), source="universal", path=str(path))


def _parameters(zero: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    if not zero.is_dir():
        raise CheckpointLoadError(f"{zero}: missing; a universal checkpoint keeps its parameters there")
    parameters: dict[str, dict[str, torch.Tensor]] = {}
    steps: dict[str, int] = {}
    for folder in sorted(zero.iterdir()):
        if folder.is_symlink():
            raise CheckpointLoadError(f"{folder}: a link inside a checkpoint; its files must be the files themselves")
        if not folder.is_dir():
            continue
        entry: dict[str, torch.Tensor] = {}
        for file in sorted(folder.iterdir()):
            if file.suffix != ".pt" or file.is_dir():
                continue
            if file.is_symlink():
                raise CheckpointLoadError(f"{file}: a link inside a checkpoint; its files must be the files themselves")
            content = load_pickle(file)
            if file.stem == STEP:
                steps[folder.name] = _step(content, file)
                continue
            entry[MASTER if file.stem == FP32 else file.stem] = _tensor(content, file)
        if MASTER not in entry:
            raise CheckpointLoadError(f"{folder / (FP32 + '.pt')} is missing: parameter {folder.name} has no fp32 "
                                      f"weights in this universal checkpoint")
        for kind, tensor in entry.items():
            if tensor.shape != entry[MASTER].shape:
                raise CheckpointLoadError(f"{folder}: {kind} of parameter {folder.name} has shape "
                                          f"{tuple(tensor.shape)}, its fp32 weights {tuple(entry[MASTER].shape)}")
        entry[MASTER] = entry[MASTER].float()
        parameters[folder.name] = entry
    if not parameters:
        raise CheckpointLoadError(f"{zero}: no parameter folders (zero/<name>/fp32.pt); not a universal checkpoint")
    distinct = set(steps.values())
    if len(distinct) > 1:
        raise CheckpointLoadError(f"{zero}: the parameters' step.pt files disagree ({sorted(distinct)[:4]})")
    return parameters, ({"step": distinct.pop()} if distinct else {})


def _tensor(content: Any, file: Path) -> torch.Tensor:
    if isinstance(content, dict):
        if any(mark in content for mark in _SPLIT_MARKS):
            raise CheckpointLoadError(f"{file}: a parameter made of sub-parameters (Megatron's fused layout) is not "
                                      f"read; its layout is Megatron's, not the model's")
        content = content.get(PARAM)
    if not torch.is_tensor(content):
        raise CheckpointLoadError(f"{file}: no '{PARAM}' tensor (found {type(content).__name__})")
    return content


def _step(content: Any, file: Path) -> int:
    if isinstance(content, dict):
        content = content.get(PARAM, content.get(STEP))
    if torch.is_tensor(content) and content.numel() == 1:
        content = content.item()
    if not isinstance(content, int | float) or isinstance(content, bool) or content < 0:
        raise CheckpointLoadError(f"{file}: holds {content!r}, not a step count")
    return round(content)


def _check_listed(main: dict, parameters: dict, zero: Path, main_path: Path) -> None:
    """Every parameter the model-states file lists has its folder; with one tensor rank, its shape."""
    shapes = main.get("param_shapes") or []
    if isinstance(shapes, dict):
        shapes = [shapes]
    single_rank = main.get("mp_world_size", 1) in (1, None)
    for group in shapes if isinstance(shapes, list) else []:
        for name, shape in (group or {}).items():
            if name not in parameters:
                raise CheckpointLoadError(f"{zero / name / (FP32 + '.pt')} is missing: {main_path.name} lists "
                                          f"parameter {name}, whose folder is not in the universal checkpoint")
            if single_rank and tuple(parameters[name][MASTER].shape) != tuple(int(d) for d in shape):
                raise CheckpointLoadError(f"{zero / name / (FP32 + '.pt')}: parameter {name} has shape "
                                          f"{tuple(parameters[name][MASTER].shape)}, {main_path.name} says "
                                          f"{tuple(shape)}")
