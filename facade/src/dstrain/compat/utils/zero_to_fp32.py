"""`deepspeed.utils.zero_to_fp32`: consolidate a ZeRO checkpoint into one fp32 state dict, with DeepSpeed's
signatures: `checkpoint_dir` is the directory `save_checkpoint` wrote (its `latest` and tags; a dstrain checkpoint
keeps its ZeRO shards under `<tag>/zero`), or a dszero checkpoint directory itself.

`convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir)` writes `output_dir/pytorch_model.bin`
as DeepSpeed does (`model.safetensors` with safe_serialization=True), in shards with Hugging Face's index file
beyond `max_shard_size`. Tied weights get every name the module's state dict has, so the result loads with
`strict=True`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

import dsaio
import dszero

from ...checkpoint.files import COMMON_FILE
from ...checkpoint.module_weights import SHARED_PARAMS
from ...checkpoint.paths import read_latest, tag_directory
from ...checkpoint.saved import read_common
from ...errors import CheckpointLoadError

_META = "zero_meta.json"  # dszero's own checkpoint directory holds it
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def _tag_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> tuple[Path, Path | None]:
    """(the ZeRO shards' directory, the tag's directory when it is a dstrain checkpoint's)."""
    root = Path(os.fspath(checkpoint_dir))
    if (root / _META).is_file():
        return root, None
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            raise CheckpointLoadError(f"{root}: no 'latest' file names a tag, and no tag was given: pass tag=, one of "
                                      f"the checkpoint's directories")
    directory = tag_directory(root, tag)
    if (directory / _META).is_file():
        return directory, None
    return directory / "zero", directory


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict[str, torch.Tensor]:
    """{parameter name: fp32 tensor} of the checkpoint's model, from its ZeRO shards, on the CPU. Tensors are read
    whole (lazy_mode is taken and reads the same); frozen parameters are not ZeRO's and not in it either way."""
    zero_dir, tag_dir = _tag_dir(checkpoint_dir, tag)
    state: dict[str, Any] = dszero.get_fp32_state_dict_from_zero_checkpoint(zero_dir)
    if tag_dir is not None and (tag_dir / COMMON_FILE).is_file():
        shared = read_common(tag_dir / COMMON_FILE).get(SHARED_PARAMS) or {}
        if not isinstance(shared, dict):
            raise CheckpointLoadError(f"{tag_dir / COMMON_FILE}: {SHARED_PARAMS} must map names to names")
        for alias, original in shared.items():
            if original in state:
                state[alias] = state[original]
    return state


def _bytes(size: int | str) -> int:
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = _SIZE.match(str(size))
    if isinstance(size, bool) or match is None:
        raise ValueError(f"max_shard_size={size!r}: give bytes (an int) or a size such as '5GB' or '500MB'")
    number, unit = float(match.group(1)), match.group(2).upper()
    base = 1024 if (match.group(3) or "").lower() == "ib" else 1000
    return int(number * base ** " KMGT".index(unit or " "))


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike,
                                               max_shard_size: int | str = "5GB", safe_serialization: bool = False,
                                               tag: str | None = None,
                                               exclude_frozen_parameters: bool = False) -> Path:
    """Write the checkpoint's fp32 weights into `output_dir`: `pytorch_model.bin` (torch.save of tensors only;
    `torch.load(..., weights_only=True)` reads it) or `model.safetensors`, sharded with an index file when larger
    than `max_shard_size`. Returns the file written (the index when sharded)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    out = Path(os.fspath(output_dir))
    if out.exists() and not out.is_dir():
        raise ValueError(f"output_dir={out} is a file; DeepSpeed's convert writes a directory "
                         f"(pytorch_model.bin or model.safetensors inside)")
    out.mkdir(parents=True, exist_ok=True)
    limit = _bytes(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        tensor_bytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + tensor_bytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor_bytes
    stem, suffix = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")

    def write(tensors: dict[str, torch.Tensor], path: Path) -> None:
        if safe_serialization:
            dsaio.save(_untied(tensors), path)
        else:
            torch.save(tensors, path)

    if len(shards) == 1:
        write(shards[0], out / f"{stem}.{suffix}")
        return out / f"{stem}.{suffix}"
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        name = f"{stem}-{index:05d}-of-{len(shards):05d}.{suffix}"
        write(shard, out / name)
        weight_map.update(dict.fromkeys(shard, name))
    index_file = out / f"{stem}.{suffix}.index.json"  # Hugging Face's names for both formats
    total = sum(t.numel() * t.element_size() for t in state.values())
    index_file.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return index_file


def _untied(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors stores no tensor twice: a tied name gets its own copy.
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        out[name] = tensor.clone() if id(tensor) in seen else tensor
        seen.add(id(tensor))
    return out


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None) -> torch.nn.Module:
    """Load the consolidated fp32 weights of a checkpoint into `model` (on the CPU) and return it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    _buffers_left_as_they_are, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise CheckpointLoadError(f"{checkpoint_dir}: the checkpoint has parameters the model lacks: {unexpected[:5]}")
    return model


__all__ = ["convert_zero_checkpoint_to_fp32_state_dict", "get_fp32_state_dict_from_zero_checkpoint",
           "load_state_dict_from_zero_checkpoint"]
