"""`load_checkpoint`: find the checkpoint (tag or `latest`), tell whose format it is, and load it.

    foreign format (FOREIGN_READERS)  -> read it whole, load_whole
    dstrain's, saved at this layout   -> verified, then each rank reads its own files
    dstrain's, saved at another       -> verified, read whole (whole.py), cut for this run

Every dstrain checkpoint is verified before a tensor is read: the manifest's checksums, the common
file's declared plain types (nothing is unpickled), every file's record (records.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .contents import WholeCheckpoint
from .deepspeed.files import is_deepspeed_directory
from .deepspeed.reader import read_deepspeed
from .layout import RunLayout
from .paths import LATEST, checked_load_tag, checkpoint_path, read_latest, tag_directory
from .protocol import LoadOptions, LoadSource
from .saved import SavedCheckpoint
from .universal.layout import is_universal_directory, read_latest_universal
from .universal.reader import read_universal
from .whole import apply, read_saved

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts


@dataclass(frozen=True)
class ForeignReader:
    """A checkpoint format dstrain did not write: `detect(tag directory)` looks at its files (and runs no
    code from them); `read(tag directory)` returns it whole, which load_whole applies at this run's layout."""

    name: str
    detect: Callable[[Path], bool]
    read: Callable[[Path], WholeCheckpoint]


# ---- Foreign formats plug in here: one line each, tried in order before dstrain's own format. -------------
FOREIGN_READERS: list[ForeignReader] = [
    # DeepSpeed's universal layout (universal/): first, since its folder holds DeepSpeed's model-states file too.
    ForeignReader("universal", is_universal_directory, read_universal),
    ForeignReader("deepspeed", is_deepspeed_directory, read_deepspeed),  # DeepSpeed's own files (deepspeed/)
]


def foreign_reader(directory: Path) -> ForeignReader | None:
    return next((reader for reader in FOREIGN_READERS if reader.detect(directory)), None)


def load_checkpoint(parts: TrainingParts, load_dir: Any, tag: Any, *, load_module_strict: bool,
                    load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool,
                    custom_load_fn: Callable[..., Any] | None = None) -> tuple[str | None, Any]:
    """(the path loaded, the client state), or (None, None) with a warning when `load_dir` has no `latest`."""
    options = LoadOptions(module_strict=load_module_strict, optimizer_states=load_optimizer_states,
                          lr_scheduler_states=load_lr_scheduler_states, module_only=load_module_only,
                          custom_load_fn=custom_load_fn)
    root = Path(load_dir)
    if tag is None:
        # With checkpoint.load_universal, DeepSpeed's ds_to_universal names its output in `latest_universal`.
        tag = (read_latest_universal(root) if parts.config.checkpoint.load_universal else None) or read_latest(root)
        if tag is None:
            warnings.warn(f"no '{LATEST}' file in {root}: nothing loaded (pass tag= to load a given checkpoint)",
                          stacklevel=3)
            return None, None
    else:
        tag = checked_load_tag(str(tag))
    directory = tag_directory(root, tag)
    reader = foreign_reader(directory) if directory.is_dir() else None
    if reader is not None:
        whole = reader.read(directory)
        apply(parts, LoadSource(whole), options)
        return str(directory), whole.client_state
    saved = SavedCheckpoint.open(checkpoint_path(root, tag))
    same = RunLayout.of(parts).matches(saved.layout)
    source = LoadSource(read_saved(saved, tensors=not same), saved, same_layout=same)
    apply(parts, source, options)
    return str(saved.path), source.whole.client_state
