"""Every file of a checkpoint says what it is, and loading checks that against the rest of the checkpoint.

The manifest proves the files unchanged since it was written, but not that they belong together: whoever
repairs a checkpoint may regenerate it. So each file records, in its header (`record` in a dsaio file's
metadata, or in zero_meta.json), the save it belongs to (an id every file of one save shares), the step,
and its place: its kind, tensor and pipeline rank, data rank, global layer, MoE layer and expert.
`check_records` reads every record (headers only) before anything is loaded and refuses, naming the
file, one from another save (a `latest` rolled back over newer ZeRO shards, a foreign expert file) or
one that sits where another belongs (swapped `tp_00`/`tp_01` folders, swapped layer files).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dsaio
import dscomm
from dszero.checkpoint import RECORD

from ..errors import CheckpointLoadError
from .files import COMMON_FILE, PLACE_KEYS, place_of

_MAX_JSON = 64 * 1024 * 1024  # zero_meta.json is small; a huge one is not ours
_WHAT = {"kind": "kind", "tp": "tensor rank [rank, of]", "pipe": "pipeline rank [rank, of]", "dp": "data rank",
         "layer": "layer", "model": "tensor rank of a layer file", "moe_layer": "MoE layer", "expert": "expert"}


def new_save_id(group: Any) -> str:
    """An id for one save, the same on every rank of `group` (collective)."""
    value = torch.tensor([secrets.randbits(62) if dist.get_rank(group) == 0 else 0], dtype=torch.int64)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dscomm.broadcast(value, src, group=group, log_name="checkpoint_save_id")
    return f"{int(value.item()):016x}"


def as_metadata(record: dict[str, Any]) -> dict[str, str]:
    """`record` as a dsaio file's metadata."""
    return {RECORD: json.dumps(record, sort_keys=True)}


def read_record(file: Path) -> dict[str, Any] | None:
    """What `file` records about itself (None: nothing)."""
    if file.suffix == ".json":
        if file.stat().st_size > _MAX_JSON:
            raise CheckpointLoadError(f"{file}: {file.stat().st_size} bytes is too large for ZeRO's metadata file")
        try:
            raw = json.loads(file.read_bytes().decode("utf-8")).get(RECORD)
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            raise CheckpointLoadError(f"{file}: not valid JSON metadata ({type(exc).__name__})") from None
        return raw if isinstance(raw, dict) else None
    try:
        text = dsaio.read_metadata(file).get(RECORD)
    except dsaio.CheckpointError as exc:
        raise CheckpointLoadError(str(exc)) from None
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise CheckpointLoadError(f"{file}: its record is not valid JSON") from None
    return raw if isinstance(raw, dict) else None


def check_records(path: Path) -> dict[str, dict[str, Any]]:
    """{relative path: record} of every file of the checkpoint at `path`, each checked against the common
    file's save and step and against its own place; CheckpointLoadError naming the first file that fails."""
    common = read_record(path / COMMON_FILE)
    if common is None or not isinstance(common.get("save"), str) or not isinstance(common.get("step"), int):
        raise CheckpointLoadError(f"{path / COMMON_FILE} records no save id and step: it was written by an older "
                                  f"dstrain, whose files cannot be checked against each other; load it with that "
                                  f"version and save it again")
    found: dict[str, dict[str, Any]] = {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            file = Path(root) / name
            relative = file.relative_to(path).as_posix()
            place = place_of(relative)
            if place is None:
                continue
            record = read_record(file)
            if record is None:
                raise CheckpointLoadError(f"{file} records nothing about itself (which save, step and place it "
                                          f"belongs to); every file of a dstrain checkpoint does, so this one was "
                                          f"put there or rewritten after the save")
            _check(file, record, place, common)
            found[relative] = record
    return found


def _check(file: Path, record: dict[str, Any], place: dict[str, Any], common: dict[str, Any]) -> None:
    if record.get("save") != common["save"] or record.get("step") != common["step"]:
        raise CheckpointLoadError(
            f"{file} belongs to another save (step {record.get('step')!r}, save {record.get('save')!r}) than this "
            f"checkpoint's {COMMON_FILE} (step {common['step']}, save {common['save']}): files of two saves were "
            f"mixed (a `latest` or a directory rolled back over newer files, or a file copied in, and the manifest "
            f"regenerated?); refusing to load a mix")
    for key in PLACE_KEYS:
        if record.get(key) != place.get(key):
            raise CheckpointLoadError(
                f"{file} records {_WHAT[key]} {record.get(key)!r}, but its place in the checkpoint is that of "
                f"{_WHAT[key]} {place.get(key)!r}: files were moved or swapped after the save (and the manifest "
                f"regenerated?); refusing to load them in the wrong place")
