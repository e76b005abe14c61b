"""A dstrain checkpoint on disk, opened for loading: every file verified against the manifest, the common
file read (only declared plain types: nothing is unpickled), the saved layout parsed, and every file's
record checked against the rest (records.py), before a single tensor is read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dsaio
import dszero
from dszero.checkpoint import verify_manifest

from ..errors import CheckpointLoadError
from .files import COMMON_FILE, engine_file, parse_rank_file
from .layout import SavedLayout, place_directory
from .records import check_records

EXCLUDED_FROZEN = "excluded_frozen"  # in the common file: names exclude_frozen_parameters left out of the module
_COMMON_KEYS = ("layout", "lr_scheduler", "client_state", "global_steps")


@dataclass
class SavedCheckpoint:
    path: Path
    common: dict[str, Any]
    layout: SavedLayout
    records: dict[str, dict[str, Any]]  # {path inside the checkpoint: what the file records about itself}

    @classmethod
    def open(cls, path: Path) -> SavedCheckpoint:
        try:
            verify_manifest(path)
        except dszero.CheckpointError as exc:
            raise CheckpointLoadError(f"cannot load checkpoint: {exc}") from None
        common = read_common(path / COMMON_FILE)
        records = check_records(path)
        if common["global_steps"] != records[COMMON_FILE]["step"]:
            raise CheckpointLoadError(f"{path / COMMON_FILE}: global_steps {common['global_steps']!r} but its record "
                                      f"says step {records[COMMON_FILE]['step']}")
        return cls(path, common, SavedLayout.from_description(common["layout"], path / COMMON_FILE), records)

    @property
    def left_out(self) -> list[str]:
        return list(self.common.get(EXCLUDED_FROZEN) or [])

    def directories(self) -> list[tuple[dict[str, list[int]], Path]]:
        """(place, directory) of every saved rank directory, in rank order."""
        return self.layout.directories(self.path)

    def first_directory(self) -> Path:
        """The first saved rank directory this disk holds (with node-local storage a node holds only its own)."""
        for place in self.layout.places():
            if (directory := place_directory(self.path, place)).is_dir():
                return directory
        raise CheckpointLoadError(f"{self.path}: none of its rank directories is here")

    def directory_of(self, place: dict[str, list[int]]) -> Path:
        return place_directory(self.path, place)

    def rank_state(self, directory: Path, dp_rank: int) -> tuple[int, dict[str, Any]]:
        """(the rank read, its counters, loader position and RNG) from `directory`: data rank `dp_rank`'s, or
        where node-local storage left only some ranks' files here, the first one present."""
        path = directory / engine_file(dp_rank)
        if not path.is_file():
            present = sorted(rank for p in directory.iterdir() if (rank := parse_rank_file(p.name)) is not None)
            if not present:
                raise CheckpointLoadError(f"{directory}: no rank file (engine_rankNNNNN.safetensors) is there")
            dp_rank, path = present[0], directory / engine_file(present[0])
        state = dsaio.load_state_dict(path)
        if not isinstance(state, dict):
            raise CheckpointLoadError(f"{path}: not a dstrain rank file")
        return dp_rank, state


def read_common(path: Path) -> dict[str, Any]:
    common = dsaio.load_state_dict(path)
    if isinstance(common, dict) and "layout" not in common and {"lr_scheduler", "client_state"} <= set(common):
        raise CheckpointLoadError(f"{path}: written by an older dstrain, which recorded neither the layout nor what "
                                  f"each file is; load it with that version and save it again")
    if not isinstance(common, dict) or not set(_COMMON_KEYS) <= set(common):
        raise CheckpointLoadError(f"{path}: not a dstrain engine file (expected the keys {sorted(_COMMON_KEYS)})")
    excluded = common.get(EXCLUDED_FROZEN, [])
    if not isinstance(excluded, list) or not all(isinstance(name, str) for name in excluded):
        raise CheckpointLoadError(f"{path}: {EXCLUDED_FROZEN} must be a list of parameter names, got "
                                  f"{type(excluded).__name__}")
    if not isinstance(common["client_state"], dict):
        raise CheckpointLoadError(f"{path}: client_state must be a dict, got {type(common['client_state']).__name__}")
    return common
