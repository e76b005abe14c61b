"""The files of a dstrain checkpoint: their names, and what a file's place in the directory says it is.

    <tag>/engine_common.safetensors          one copy: scheduler, client state, step hooks, the layout
    <tag>/model_states.safetensors           the module's weights and buffers (no pipeline)
    <tag>/layer_XX-model_states.safetensors  a pipeline's weights, one file per layer (DeepSpeed's names);
    <tag>/layer_XX-model_YY-model_states.safetensors   ... per layer and tensor rank YY, with tensor parallelism
    <tag>/layer_L_expert_E_mp_rank_00_model_states.safetensors   one per (MoE layer, global expert)
    <tag>/zero/                              ZeRO's shards over the data-parallel group (dszero)
    <tag>/engine_rankNNNNN.safetensors       each data rank's counters, loader position and RNG
    <tag>/manifest.json                      every file above, checksummed (dszero's manifest)

A tensor-parallel run keeps a rank's files (module, experts, zero/, engine_rank*) in `tp_RR_of_SS/`, a
pipeline in `pipe_RR_of_SS/` (its layer files stay at the top: they load at any number of stages).
`place_of` reads a file's path back into what it should be, which records.py checks against what the
file itself says.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

COMMON_FILE = "engine_common.safetensors"
MODEL_FILE = "model_states.safetensors"
ZERO_DIR = "zero"
SUFFIX = ".safetensors"

_TP_DIR = re.compile(r"tp_(\d{2,})_of_(\d{2,})")
_PIPE_DIR = re.compile(r"pipe_(\d{2,})_of_(\d{2,})")
_RANK_FILE = re.compile(r"engine_rank(\d{5,})\.safetensors")
_LAYER_FILE = re.compile(r"layer_(\d{2,})(?:-model_(\d{2,}))?-model_states\.safetensors")
_EXPERT_FILE = re.compile(r"layer_(\d+)_expert_(\d+)_mp_rank_(\d{2})_model_states\.safetensors")
_ZERO_SHARD = re.compile(r"zero_shard_(\d{5})-of-(\d{5})\.safetensors")
_ZERO_META = "zero_meta.json"


def engine_file(dp_rank: int) -> str:
    return f"engine_rank{dp_rank:05d}{SUFFIX}"


def tp_directory(rank: int, size: int) -> str:
    return f"tp_{rank:02d}_of_{size:02d}"


def stage_directory(pipe_rank: int, ranks: int) -> str:
    return f"pipe_{pipe_rank:02d}_of_{ranks:02d}"


def parse_expert_file(name: str) -> tuple[int, int] | None:
    """(MoE layer, global expert) of an expert file's name, or None."""
    match = _EXPERT_FILE.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_rank_file(name: str) -> int | None:
    """The data rank of a rank file's name, or None."""
    match = _RANK_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_layer_file(name: str) -> int | None:
    match = _LAYER_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def layer_file_tensor_rank(name: str) -> int | None:
    """The tensor rank a layer file's name holds the cut of (`-model_YY-`), or None (a whole layer)."""
    match = _LAYER_FILE.fullmatch(name)
    return int(match.group(2)) if match and match.group(2) is not None else None


def place_of(relative: str) -> dict[str, Any] | None:
    """What the file at `relative` (inside a tag directory) must record about itself, or None for a file
    this format does not name (nothing to check). Every key returned is compared with the file's record."""
    path = PurePosixPath(relative)
    place: dict[str, Any] = {}
    in_zero = False
    for part in path.parts[:-1]:
        if (match := _TP_DIR.fullmatch(part)) and "tp" not in place and not in_zero:
            place["tp"] = [int(match.group(1)), int(match.group(2))]
        elif (match := _PIPE_DIR.fullmatch(part)) and "pipe" not in place and not in_zero:
            place["pipe"] = [int(match.group(1)), int(match.group(2))]
        elif part == ZERO_DIR and not in_zero:
            in_zero = True
        else:
            return None
    name = path.name
    if in_zero:  # dszero's shards say which group rank they hold themselves; the record says which save
        return {**place, "kind": "zero"} if name == _ZERO_META or _ZERO_SHARD.fullmatch(name) else None
    if name == COMMON_FILE:
        return {"kind": "common"} if not place else None
    if name == MODEL_FILE:
        return {**place, "kind": "module"}
    if match := _RANK_FILE.fullmatch(name):
        return {**place, "kind": "rank", "dp": int(match.group(1))}
    if (layer := parse_layer_file(name)) is not None:
        model = layer_file_tensor_rank(name)
        return {**place, "kind": "layer", "layer": layer, **({"model": model} if model is not None else {})}
    if (expert := parse_expert_file(name)) is not None:
        return {**place, "kind": "expert", "moe_layer": expert[0], "expert": expert[1]}
    return None


# The keys of a record that say where a file belongs; the others ("save", "step", "prefix", ...) say more.
PLACE_KEYS = ("kind", "tp", "pipe", "dp", "layer", "model", "moe_layer", "expert")
