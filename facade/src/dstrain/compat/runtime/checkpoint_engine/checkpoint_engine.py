"""`deepspeed.runtime.checkpoint_engine.checkpoint_engine`: what a checkpoint engine answers (DeepSpeed's
interface): `save(state_dict, path)`, `load(path)`, and the hooks a save goes through (`create`, `commit`), which do
nothing here: each file is written atomically and durably by itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class CheckpointCommitInfo:
    """Which save a `create` / `commit` is about."""

    tag: Any
    save_dir: Any
    save_latest: bool = True


class CheckpointEngine:
    """A checkpoint engine: subclasses write and read one state dict per file (`save`, `load`)."""

    suffix = ".pt"

    def __init__(self, config_params: Any = None) -> None:
        self.config_params = config_params
        self.commit_info: CheckpointCommitInfo | None = None

    def create(self, info: CheckpointCommitInfo) -> None:
        """A save begins (nothing to prepare)."""
        self.commit_info = info

    def save(self, state_dict: Any, path: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__}.save(state_dict, path)")

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def load(self, path: Any, map_location: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.load(path)")

    def commit(self, info: CheckpointCommitInfo) -> bool:
        """A save is complete: every file was already written atomically and durably."""
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def set_commit_info(self, info: CheckpointCommitInfo) -> None:
        self.commit_info = info

    def get_commit_info(self) -> CheckpointCommitInfo | None:
        return self.commit_info

    def cleanup(self) -> None:
        """Nothing is left running after a save."""

    def preserves_storage_sharing(self) -> bool:
        return False


__all__ = ["CheckpointCommitInfo", "CheckpointEngine"]
