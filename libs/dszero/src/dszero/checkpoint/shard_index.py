"""What the shard files of a checkpoint hold, found by the parameters each group covers.

Every shard file records, for each parameter group it holds, the group's layout (its parameters'
names and shapes), the size of the process group it was partitioned over and its rank there. A
group is identified by its parameters, not by its index or by which rank wrote it: experts over an
expert-data group, or groups that exist on some ranks only, are found wherever they were written,
and reload at another world size or expert layout by cutting their elements anew.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import dsaio

from ..errors import CheckpointError
from ..layout import GroupLayout, Slot

SHARD_PATTERN = re.compile(r"zero_shard_(\d{5})-of-(\d{5})\.safetensors")
_MAX_HEADER = 100_000_000


def shard_name(rank: int, world: int) -> str:
    return f"zero_shard_{rank:05d}-of-{world:05d}.safetensors"


def group_key(layout: GroupLayout) -> tuple:
    """What identifies a group across saves: its parameters' names and shapes, in order."""
    return tuple((slot.name, tuple(slot.shape)) for slot in layout.slots)


def layout_to_json(layout: GroupLayout) -> dict[str, Any]:
    return {"world_size": layout.world_size, "alignment": layout.alignment,
            "slots": [[s.name, list(s.shape), s.offset, s.numel] for s in layout.slots]}


def layout_from_json(data: dict[str, Any], where: Path) -> GroupLayout:
    try:
        slots = tuple(Slot(str(name), tuple(int(d) for d in shape), int(offset), int(numel))
                      for name, shape, offset, numel in data["slots"])
        return GroupLayout(slots, int(data["world_size"]), int(data["alignment"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: a group layout is malformed ({type(exc).__name__}: {exc})") from None


class Entry:
    """One group's shard in one file."""

    def __init__(self, file: Path, data: dict[str, Any]):
        try:
            self.file = file
            self.index = int(data["index"])  # the group's index inside this file's tensor names
            self.group_world = int(data["group_world"])
            self.group_rank = int(data["group_rank"])
            self.scalars = dict(data.get("scalars", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{file}: a group entry is malformed ({type(exc).__name__}: {exc})") from None
        self.layout = layout_from_json(data["layout"], file)
        self.key = group_key(self.layout)


class ShardIndex:
    """Every group entry of every shard file in a checkpoint directory; tensors read once, on first use."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: list[Entry] = []
        self._tensors: dict[Path, dict[str, torch.Tensor]] = {}
        for file in sorted(path.iterdir()):
            if SHARD_PATTERN.fullmatch(file.name):
                try:
                    groups = json.loads(_read_metadata(file).get("groups", "[]"))
                except json.JSONDecodeError as exc:
                    raise CheckpointError(f"{file}: its group list is not valid JSON ({exc})") from None
                if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
                    raise CheckpointError(f"{file}: its group list is malformed")
                self.entries += [Entry(file, data) for data in groups]

    def instances(self, key: tuple) -> dict[int, list[Entry]]:
        """The saved shards of the group with these parameters: {rank in its group: entries}."""
        found: dict[int, list[Entry]] = {}
        for entry in self.entries:
            if entry.key == key:
                found.setdefault(entry.group_rank, []).append(entry)
        return found

    def complete_groups(self) -> Iterator[tuple[GroupLayout, dict[int, list[Entry]]]]:
        """(layout, shards by rank in the group) of each saved group once, in saved order; a group with a
        rank's shard missing is an error naming the ranks."""
        for key in dict.fromkeys(entry.key for entry in self.entries):
            shards = self.instances(key)
            layout = shards[0][0].layout
            missing = sorted(set(range(layout.world_size)) - set(shards))
            if missing:
                raise CheckpointError(f"{self.path}: the shard(s) of rank(s) {missing} of a {layout.world_size}-rank "
                                      f"parameter group are missing (group starting with {layout.slots[0].name!r})")
            yield layout, shards

    def tensors(self, entry: Entry) -> dict[str, torch.Tensor]:
        if entry.file not in self._tensors:
            self._tensors[entry.file] = dsaio.load(entry.file, framework="pt")
        return self._tensors[entry.file]

    def tensor(self, entry: Entry, kind: str) -> torch.Tensor:
        name = f"group{entry.index}.{kind}"
        tensors = self.tensors(entry)
        if name not in tensors:
            raise CheckpointError(f"{entry.file}: {name} is missing")
        return tensors[name]

    def state_keys(self, entry: Entry) -> list[str]:
        prefix = f"group{entry.index}.state."
        return [name[len(prefix):] for name in self.tensors(entry) if name.startswith(prefix)]


def _read_metadata(file: Path) -> dict[str, str]:
    # Only the header: the manifest, checked before this, pins its bytes; the data are read when needed.
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{file}: truncated")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER:
            raise CheckpointError(f"{file}: header length {length} is not plausible")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{file}: header is not valid JSON ({exc})") from None
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return metadata if isinstance(metadata, dict) else {}
