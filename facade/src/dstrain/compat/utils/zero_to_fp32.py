"""`deepspeed.utils.zero_to_fp32`: consolidate a ZeRO checkpoint into one fp32 state dict, with DeepSpeed's
signatures, from dstrain's checkpoints of any layout (read whole), from DeepSpeed's own (its `zero_pp_rank_*`
files, read through the restricted unpickler) and from a bare dszero checkpoint directory. `checkpoint_dir` is
the directory `save_checkpoint` wrote (its `latest` and tags), a tag's directory, or a dszero directory.

`convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir)` writes `output_dir/pytorch_model.bin`
as DeepSpeed does (`model.safetensors` with safe_serialization=True), in shards with Hugging Face's index file
beyond `max_shard_size`. Tied weights get every name the module's state dict has, so the result loads with
`strict=True`.

    python -m dstrain.utils.zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR [--safe_serialization] [--max_shard_size 5GB]
                                         [-t TAG] [--exclude_frozen_parameters]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

import dsaio
import dszero

from ...checkpoint.contents import MASTER
from ...checkpoint.deepspeed.files import get_model_state_files, get_optim_files, is_deepspeed_directory
from ...checkpoint.deepspeed.reader import read_deepspeed
from ...checkpoint.files import COMMON_FILE
from ...checkpoint.module_weights import FROZEN_PARAMS, SHARED_PARAMS
from ...checkpoint.paths import read_latest, tag_directory
from ...checkpoint.saved import read_common
from ...checkpoint.whole import read_whole
from ...errors import CheckpointLoadError, DstrainError

_META = "zero_meta.json"  # dszero's own checkpoint directory holds it
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def _checkpoint_directory(root: Path, tag: str | None) -> Path:
    """The directory holding one checkpoint's files: `root` itself, or its tag's (given, or from `latest`)."""
    if is_deepspeed_directory(root) or (root / COMMON_FILE).is_file() or (root / _META).is_file():
        return root
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            raise CheckpointLoadError(f"{root}: no 'latest' file names a tag, and no tag was given: pass tag=, one of "
                                      f"the checkpoint's directories")
    return tag_directory(root, tag)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict[str, torch.Tensor]:
    """{name: fp32 tensor}: every trained parameter's fp32 master weights, whole, on the CPU (lazy_mode is taken
    and reads the same). From DeepSpeed's checkpoints also the module's other entries (frozen parameters,
    buffers) in fp32 unless exclude_frozen_parameters, as DeepSpeed's own script does; from dstrain's the frozen
    parameters (the module file's, ZeRO-3's included)."""
    directory = _checkpoint_directory(Path(os.fspath(checkpoint_dir)), tag)
    if is_deepspeed_directory(directory):
        whole = read_deepspeed(directory)
        state: dict[str, Any] = {name: entry[MASTER] for name, entry in whole.parameters.items()}
        if not exclude_frozen_parameters:
            for name, value in whole.module.items():
                if name not in state:
                    state[name] = value.float() if value.is_floating_point() else value
        return state
    if not (directory / COMMON_FILE).is_file():
        zero_dir = directory if (directory / _META).is_file() else directory / "zero"
        return dszero.get_fp32_state_dict_from_zero_checkpoint(zero_dir)
    whole = read_whole(directory)
    state = {name: entry[MASTER] for name, entry in whole.parameters.items()}
    common = read_common(directory / COMMON_FILE)
    shared = common.get(SHARED_PARAMS) or {}
    if not isinstance(shared, dict):
        raise CheckpointLoadError(f"{directory / COMMON_FILE}: {SHARED_PARAMS} must map names to names")
    frozen = common.get(FROZEN_PARAMS) or []
    if not isinstance(frozen, list) or not all(isinstance(name, str) for name in frozen):
        raise CheckpointLoadError(f"{directory / COMMON_FILE}: {FROZEN_PARAMS} must be a list of parameter names")
    if not exclude_frozen_parameters:  # the frozen parameters, from the module file (in fp32), as DeepSpeed's
        for name in frozen:
            value = whole.module.get(name)
            if value is not None and name not in state:
                state[name] = value.float() if value.is_floating_point() else value
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
    """Load the consolidated fp32 weights of a checkpoint (dstrain's or DeepSpeed's) into `model` (on the
    CPU) and return it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    _buffers_left_as_they_are, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise CheckpointLoadError(f"{checkpoint_dir}: the checkpoint has parameters the model lacks: {unexpected[:5]}")
    return model


def main(argv: list[str] | None = None) -> int:
    """DeepSpeed's zero_to_fp32.py command line."""
    parser = argparse.ArgumentParser(prog="zero_to_fp32", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="the directory with 'latest' (dstrain's or DeepSpeed's)")
    parser.add_argument("output_dir", help="where pytorch_model.bin (or model.safetensors) is written")
    parser.add_argument("--max_shard_size", default="5GB", help="shard beyond this size (default 5GB)")
    parser.add_argument("--safe_serialization", action="store_true", help="write safetensors files")
    parser.add_argument("-t", "--tag", default=None, help="sub-directory of checkpoint_dir (default: 'latest')")
    parser.add_argument("--exclude_frozen_parameters", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_dir, args.max_shard_size,
                                                         args.safe_serialization, args.tag,
                                                         args.exclude_frozen_parameters)
    except (DstrainError, dszero.CheckpointError, OSError, ValueError) as exc:
        parser.exit(1, f"zero_to_fp32: {exc}\n")
    print(f"zero_to_fp32: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["convert_zero_checkpoint_to_fp32_state_dict", "get_fp32_state_dict_from_zero_checkpoint",
           "get_model_state_files", "get_optim_files", "load_state_dict_from_zero_checkpoint"]
