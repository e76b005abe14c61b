"""A WholeCheckpoint written as DeepSpeed's universal layout (layout.py), which DeepSpeed 0.19.8 loads with
`"checkpoint": {"load_universal": true}` at any data-parallel size, and dstrain at any layout.

The folder is written beside its final place (`<out>.partial`) and renamed into place when every file is
there, so an interrupted conversion leaves no folder that looks complete. The files are plain torch
files of tensors and containers (no class of DeepSpeed's is pickled: DeepSpeed keeps its configured loss
scaler and gradient clipping when it loads them).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointLoadError
from ..contents import MASTER, WholeCheckpoint
from .layout import (
    DS_FORMAT_VERSION,
    FP32,
    LATEST_UNIVERSAL,
    MODEL_STATES,
    OPTIMIZER_STATE,
    PARAM,
    STEP,
    ZERO,
    ZERO3_MODEL_STATES,
    check_parameter_name,
)

UNIVERSAL_VERSION = 0.4  # DeepSpeed's universal_checkpoint_version of this layout


def write_universal(whole: WholeCheckpoint, output: str | os.PathLike, *, workers: int = 4,
                    keep_partial: bool = False, strict: bool = True) -> Path:
    """Write `whole` under `output` (a new folder) and name it in `<output's parent>/latest_universal`."""
    final = Path(os.path.abspath(output))
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise CheckpointLoadError(f"{final} already exists and is not empty; a conversion writes a new folder (remove "
                                  f"it or choose another --output_folder)")
    if strict:
        bare = sorted(n for n, e in whole.parameters.items() if set(e) == {MASTER})
        if bare and any(len(e) > 1 for e in whole.parameters.values()):
            raise CheckpointLoadError(f"{whole.path}: parameter(s) {bare[:5]} have fp32 weights but no optimizer "
                                      f"state while others have it (--no_strict writes them with their weights only)")
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / ZERO).mkdir(parents=True)
    try:
        _write_parameters(whole, partial / ZERO, workers)
        torch.save(_optimizer_state(whole), partial / ZERO / OPTIMIZER_STATE)
        model_states = _model_states(whole)
        torch.save(model_states, partial / MODEL_STATES)
        # A ZeRO-3 run of DeepSpeed looks for this name; it reads only the run's state from it, not the module.
        torch.save({**model_states, "module": {}}, partial / ZERO3_MODEL_STATES)
    except BaseException:
        if not keep_partial:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    if final.exists():
        final.rmdir()
    partial.rename(final)
    (final.parent / LATEST_UNIVERSAL).write_text(final.name)
    return final


def _write_parameters(whole: WholeCheckpoint, zero: Path, workers: int) -> None:
    step = whole.scalars.get("step")
    jobs = []
    for name, entry in whole.parameters.items():
        folder = zero / check_parameter_name(name)
        folder.mkdir()
        for kind, tensor in entry.items():
            stem = FP32 if kind == MASTER else kind
            value = tensor.float() if kind == MASTER else tensor
            jobs.append((folder / f"{stem}.pt", {PARAM: _compact(value.detach())}))
        if step is not None and len(entry) > 1:
            jobs.append((folder / f"{STEP}.pt", torch.tensor(float(step))))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for _ in pool.map(lambda job: torch.save(job[1], job[0]), jobs):
            pass


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its elements: torch.save writes a view's whole storage (a parameter read
    from DeepSpeed's files is a view of its rank's flat buffer)."""
    if tensor.is_contiguous() and tensor.storage_offset() == 0 \
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _optimizer_state(whole: WholeCheckpoint) -> dict[str, Any]:
    groups = [dict(g) for g in whole.param_groups] or [{}]
    state = {0: {"step": torch.tensor(float(whole.scalars["step"]))}} if "step" in whole.scalars else {}
    return {"param_groups": groups, "optimizer_state_dict": {"state": state, "param_groups": groups},
            "ds_version": DS_FORMAT_VERSION}


def _model_states(whole: WholeCheckpoint) -> dict[str, Any]:
    trained = {name: torch.Size(entry[MASTER].shape) for name, entry in whole.parameters.items()}
    # The trained parameters live in zero/<name>/fp32.pt (DeepSpeed's universal load takes them from there
    # and never reads the module): the module keeps what has no folder there, buffers and frozen weights.
    module = {name: _compact(tensor.detach()) for name, tensor in whole.module.items() if name not in trained}
    progress = whole.progress
    steps = int(progress.get("global_steps", 0))
    states = {
        "module": module, "buffer_names": list(module), "optimizer": None,
        "param_shapes": [trained], "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
        "lr_scheduler": whole.lr_scheduler, "data_sampler": None, "random_ltd": None,
        "skipped_steps": int(progress.get("skipped_steps", 0)), "global_steps": steps,
        "global_samples": int(progress.get("global_samples", 0)), "dp_world_size": 1, "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1}, "ds_version": DS_FORMAT_VERSION,
        "universal_checkpoint_info": {"universal_checkpoint_version": UNIVERSAL_VERSION},
    }
    client = dict(whole.client_state)
    # A client's own universal_checkpoint_info (DeepSpeed's converter requires one; Megatron-DeepSpeed's patterns
    # go there) is carried over as DeepSpeed's converter copies it; the version is ours, as the files are.
    info = client.pop("universal_checkpoint_info", None)
    if info is not None:
        if not isinstance(info, dict):
            raise CheckpointLoadError(f"{whole.path}: the client state's 'universal_checkpoint_info' is a "
                                      f"{type(info).__name__}; DeepSpeed's converter and loader read it as a dict")
        states["universal_checkpoint_info"] = {**info, "universal_checkpoint_version": UNIVERSAL_VERSION}
    clashes = sorted(set(client) & set(states))
    if clashes:
        raise CheckpointLoadError(f"{whole.path}: the client state's keys {clashes} are DeepSpeed's own names in a "
                                  f"model-states file; rename them to convert this checkpoint")
    states.update(client)
    return states
