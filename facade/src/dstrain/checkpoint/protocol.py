"""The one protocol every part of a training run checkpoints through.

A part (the module's weights, ZeRO's optimizer state, the scheduler, the client's state, the step hooks,
the progress counters, a rank's loader position and RNG) says three things:

- `save(out)`: what it saves. Small state goes into the common file (`out.common`, one copy) or this
  rank's file (`out.rank`); both are checked before any rank writes a byte. Tensors go into files of
  the part's own, written later through `out.write(...)` into this rank's directory (`out.directory`),
  where the run's layout (`out.layout`: data, tensor, pipeline and expert parallelism) puts them, each
  file with its record (`out.record(...)`).
- `read(saved, whole)`: how its tensors lie across a saved run's ranks, undone: its state from a dstrain
  checkpoint of any layout, whole, into a `WholeCheckpoint`.
- `load(source, options)`: how it loads, at the layout it was saved at (`source.same_layout`: each rank
  reads its own files) or at any other (from `source.whole`, cut for this run by `layout.cut`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .records import as_metadata

if TYPE_CHECKING:
    from .contents import WholeCheckpoint
    from .layout import RunLayout
    from .saved import SavedCheckpoint


@dataclass(frozen=True)
class LoadOptions:
    """load_checkpoint's keyword arguments, as DeepSpeed names them (without the load_ prefix)."""

    module_strict: bool = True
    optimizer_states: bool = True
    lr_scheduler_states: bool = True
    module_only: bool = False
    custom_load_fn: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.custom_load_fn is not None and not callable(self.custom_load_fn):
            raise TypeError(f"load_checkpoint(custom_load_fn=...) must be callable as custom_load_fn(src=<state dict>, "
                            f"dst=<module>), got {type(self.custom_load_fn).__name__}")


@dataclass
class LoadSource:
    """What a load reads from: the checkpoint whole (at the same layout only its small state: the tensor
    parts read their own files from `saved`), and dstrain's files when the checkpoint is dstrain's."""

    whole: WholeCheckpoint
    saved: SavedCheckpoint | None = None
    same_layout: bool = False


@dataclass
class SaveTarget:
    """One rank's side of a save, filled by the parts and then written by writer.py."""

    layout: RunLayout
    step: int
    node_local: bool
    common: dict[str, Any] = field(default_factory=dict)  # the common file (written once)
    rank: dict[str, Any] = field(default_factory=dict)  # this rank's file
    save_id: str = ""  # shared by every file of this save; set once every check passed
    top: Path | None = None  # the save's `.partial` directory
    directory: Path | None = None  # this rank's directory in it (layout.shard_directory)
    writes_shard_files: bool = False  # this rank writes its directory's shared files (its data group has one writer)
    writes: list[Callable[[], None]] = field(default_factory=list)

    def write(self, action: Callable[[], None]) -> None:
        """Run `action` when the files are written (after every check; in the same order on every rank)."""
        self.writes.append(action)

    def record_of(self, kind: str, *, placed: bool = True, **fields: Any) -> dict[str, Any]:
        """What a file of this save records about itself: the save, the step, its kind, its place (this
        rank's tensor / pipeline coordinates when it lives in this rank's directory) and `fields`."""
        return {"save": self.save_id, "step": self.step, "kind": kind, **(self.layout.place() if placed else {}),
                **fields}

    def record(self, kind: str, *, placed: bool = True, **fields: Any) -> dict[str, str]:
        """record_of(...) as a dsaio file's metadata."""
        return as_metadata(self.record_of(kind, placed=placed, **fields))


class CheckpointPart(Protocol):
    """One part of a training run in a checkpoint (see the module docstring)."""

    holds_tensors: ClassVar[bool]  # read whole only when loading at another layout

    def save(self, out: SaveTarget) -> None: ...

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None: ...

    def load(self, source: LoadSource, options: LoadOptions) -> None: ...
