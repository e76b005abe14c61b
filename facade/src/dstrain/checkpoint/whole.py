"""Loading at another layout, and loading what others wrote, goes through one shape: `WholeCheckpoint`
(contents.py), each tensor whole by its name in the model.

    whole = read_whole("ckpt/global_step100")        # a dstrain checkpoint of any layout
    load_whole(parts, whole, load_module_strict=True, load_optimizer_states=True,
               load_lr_scheduler_states=True, load_module_only=False)

`read_whole` undoes the saved layout part by part (protocol.py: each part's `read`); `load_whole` hands
the whole checkpoint to each part of the run (`load`), which cuts it for this rank: the module's weights,
ZeRO's masters and moments through `dszero.checkpoint.load_parameter_states`, the scheduler, the
counters, the step hooks, the loss scaler. A reader of another format (DeepSpeed's files, its universal
layout: reader.py's FOREIGN_READERS) produces a WholeCheckpoint and loads through `load_whole` too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dscomm

from ..errors import CheckpointLoadError
from ..logs import log_on_rank0
from .contents import WholeCheckpoint
from .files import COMMON_FILE
from .layout import RunLayout
from .paths import checkpoint_path, read_latest
from .protocol import LoadOptions, LoadSource
from .run_parts import READ_ORDER, checkpoint_parts
from .saved import SavedCheckpoint

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts


def read_whole(path: str | os.PathLike) -> WholeCheckpoint:
    """The dstrain checkpoint at `path` (a tag directory, or a save directory whose `latest` names one),
    saved at any data / tensor / pipeline / expert layout, each tensor whole; verified first (manifest and
    every file's record). Reads every rank's files: memory for the whole model and its optimizer state."""
    path = Path(path)
    if not (path / COMMON_FILE).is_file() and (tag := read_latest(path)) is not None:
        path = checkpoint_path(path, tag)
    return read_saved(SavedCheckpoint.open(path))


def read_saved(saved: SavedCheckpoint, *, tensors: bool = True) -> WholeCheckpoint:
    """`saved` whole; tensors=False: its small state only (module and parameters left empty)."""
    whole = WholeCheckpoint(module={}, parameters={}, source="dstrain", path=str(saved.path))
    for part in READ_ORDER:
        if tensors or not part.holds_tensors:
            part.read(saved, whole)
    return whole


def load_whole(parts: TrainingParts, whole: WholeCheckpoint, *, load_module_strict: bool = True,
               load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
               load_module_only: bool = False) -> dict[str, Any]:
    """Apply `whole` to the run of `parts` at this run's layout (collective over every rank); returns the
    client state. As load_checkpoint's options: load_module_only loads the weights (and ZeRO's masters
    from them, or from `whole.parameters`' masters) and nothing else; load_optimizer_states=False starts
    the optimizer's moments afresh; a trained parameter missing from `whole` is an error unless
    load_module_strict=False (then it keeps its current value)."""
    options = LoadOptions(module_strict=load_module_strict, optimizer_states=load_optimizer_states,
                          lr_scheduler_states=load_lr_scheduler_states, module_only=load_module_only)
    apply(parts, LoadSource(whole), options)
    return whole.client_state


def apply(parts: TrainingParts, source: LoadSource, options: LoadOptions) -> None:
    """Every part of the run loads from `source` (collective)."""
    if not source.same_layout:
        check_consistent(source.whole)
    layout = RunLayout.of(parts)
    for part in checkpoint_parts(parts, layout):
        part.load(source, options)
    dscomm.barrier(group=layout.world_group)
    how = "at its own layout" if source.same_layout else f"whole ({source.whole.source}), cut for this layout"
    log_on_rank0(parts.global_rank, f"loaded checkpoint {source.whole.path} {how} (step {parts.progress.global_steps})")


def check_consistent(whole: WholeCheckpoint) -> None:
    """Every parameter's master and optimizer states have its weight's shape (checked before the run is
    touched, so a bad checkpoint loads nothing)."""
    for name, kinds in whole.parameters.items():
        for kind, tensor in kinds.items():
            weight = whole.module.get(name)
            if weight is not None and tuple(tensor.shape) != tuple(weight.shape) and tensor.dim():
                raise CheckpointLoadError(f"{whole.path or whole.source}: {name}: its {kind} is {tuple(tensor.shape)} "
                                          f"but its weight {tuple(weight.shape)}; nothing was loaded")
