"""Checkpoints dstrain did not write, found from the files: `load_checkpoint` reads them without the
user's line changing.

    readers: DeepSpeed's own files (deepspeed/), DeepSpeed's universal layout (universal/)

A tag directory holding dstrain's engine file is dstrain's own and none of this applies. Otherwise each
reader says whether the directory is its kind; the first that does reads it into a WholeCheckpoint,
which loads into the run at its layout. With `checkpoint.load_universal` the tag comes from DeepSpeed's
`latest_universal` file when there is one (as DeepSpeed reads it), else from `latest`.

STAND-IN dispatch until the checkpoint seam (issue 30, section 1) lands its reader registry; the readers
in deepspeed/ and universal/ then plug into that registry unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointLoadError
from .contents import WholeCheckpoint
from .deepspeed.files import is_deepspeed_directory
from .deepspeed.reader import read_deepspeed
from .paths import read_latest, tag_directory
from .universal.layout import is_universal_directory
from .universal.reader import read_universal

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts

LATEST_UNIVERSAL = "latest_universal"
DSTRAIN_MARK = "engine_common.safetensors"  # engine_checkpoint.COMMON_FILE: a dstrain checkpoint's own file


@dataclass(frozen=True)
class ForeignReader:
    name: str
    detects: Callable[[Path], bool]
    read: Callable[[Path], WholeCheckpoint]


# Universal first: its folder also holds DeepSpeed's model-states file beside zero/.
READERS = (ForeignReader("universal", is_universal_directory, read_universal),
           ForeignReader("deepspeed", is_deepspeed_directory, read_deepspeed))


def find_foreign(config: Any, load_dir, tag: Any) -> tuple[ForeignReader, Path] | None:
    """(the reader, the tag directory) when `load_dir`/`tag` is a checkpoint another program wrote, else None
    (dstrain's own, or nothing to load: the caller's own checks and messages apply)."""
    root = Path(load_dir)
    if tag is None:
        if config.checkpoint.load_universal and (root / LATEST_UNIVERSAL).is_file():
            tag = _read_tag_file(root, LATEST_UNIVERSAL)
        else:
            tag = read_latest(root)
        if tag is None:
            return None
    directory = tag_directory(root, str(tag)) if _plain_name(str(tag)) else None
    if directory is None or not directory.is_dir() or (directory / DSTRAIN_MARK).is_file():
        return None
    for reader in READERS:
        if reader.detects(directory):
            return reader, directory
    return None


def _plain_name(tag: str) -> bool:
    return bool(tag) and tag not in (".", "..") and "/" not in tag and "\\" not in tag and "\0" not in tag


def _read_tag_file(root: Path, name: str) -> str:
    """A tag file DeepSpeed writes (`latest_universal`): one directory name."""
    path = root / name
    raw = path.read_bytes()[:1024]
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointLoadError(f"{path} is not UTF-8 text; it should hold one checkpoint tag") from None
    if not _plain_name(tag):
        raise CheckpointLoadError(f"{path} names {tag!r}, which is not one directory name inside {root}")
    return tag


def load_foreign(parts: TrainingParts, found: tuple[ForeignReader, Path], *, load_module_strict: bool,
                 load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool,
                 stage_of_pipeline: bool = False, group: Any = None) -> tuple[str, dict]:
    """Read the whole checkpoint, then load it (nothing is applied before every file was read and checked)."""
    from .whole_loader import load_whole

    reader, directory = found
    whole = reader.read(directory)
    client = load_whole(parts, whole, load_module_strict=load_module_strict,
                        load_optimizer_states=load_optimizer_states, load_lr_scheduler_states=load_lr_scheduler_states,
                        load_module_only=load_module_only, stage_of_pipeline=stage_of_pipeline, group=group)
    return str(directory), client
