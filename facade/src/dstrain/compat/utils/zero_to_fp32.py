"""`deepspeed.utils.zero_to_fp32`: consolidate a ZeRO checkpoint into one fp32 state dict, from dstrain's
checkpoints of any layout (read whole), from DeepSpeed's own (its `zero_pp_rank_*` files, read through the
restricted unpickler) and from a bare dszero checkpoint directory.

    python -m dstrain.utils.zero_to_fp32 CHECKPOINT_DIR OUTPUT.safetensors [--tag TAG]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

import dsaio
import dszero
from dszero import convert_zero_checkpoint_to_fp32_state_dict as _dszero_convert
from dszero import get_fp32_state_dict_from_zero_checkpoint as _dszero_fp32

from ...checkpoint.contents import MASTER
from ...checkpoint.deepspeed.files import is_deepspeed_directory
from ...checkpoint.deepspeed.reader import read_deepspeed
from ...checkpoint.files import COMMON_FILE
from ...checkpoint.paths import read_latest, tag_directory
from ...checkpoint.whole import read_whole
from ...errors import CheckpointLoadError, DstrainError


def _tag_dir(root: Path, tag: str | None) -> Path:
    if tag is None:
        tag = read_latest(root)
    return tag_directory(root, tag) if tag is not None else root


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
    """{name: fp32 tensor}: every trained parameter's fp32 master weights, whole. `checkpoint_dir` is the
    directory with `latest` (or `tag`'s directory itself) of a dstrain checkpoint of any layout, or of
    DeepSpeed's (then, as DeepSpeed's own script does, also the module's other entries, frozen parameters
    and buffers, in fp32, unless exclude_frozen_parameters), or a bare dszero checkpoint directory."""
    root = Path(os.fspath(checkpoint_dir))
    directory = _checkpoint_directory(root, tag)
    if is_deepspeed_directory(directory):
        whole = read_deepspeed(directory)
        state: dict[str, Any] = {name: entry[MASTER] for name, entry in whole.parameters.items()}
        if not exclude_frozen_parameters:
            for name, value in whole.module.items():
                if name not in state:
                    state[name] = value.float() if value.is_floating_point() else value
        return state
    if (directory / COMMON_FILE).is_file():
        return {name: entry[MASTER] for name, entry in read_whole(directory).parameters.items()}
    return _dszero_fp32(checkpoint_dir, tag)


def _checkpoint_directory(root: Path, tag: str | None) -> Path:
    if is_deepspeed_directory(root) or (root / COMMON_FILE).is_file():
        return root
    return _tag_dir(root, tag)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike, output_file: str | os.PathLike,
                                               tag: str | None = None, exclude_frozen_parameters: bool = False) -> Path:
    """Write the consolidated fp32 weights as one safetensors file (a directory gets model.safetensors)."""
    directory = _checkpoint_directory(Path(os.fspath(checkpoint_dir)), tag)
    if not (is_deepspeed_directory(directory) or (directory / COMMON_FILE).is_file()):
        return _dszero_convert(checkpoint_dir, output_file, tag)
    state = get_fp32_state_dict_from_zero_checkpoint(directory, exclude_frozen_parameters=exclude_frozen_parameters)
    output = Path(output_file)
    if output.is_dir():
        output = output / "model.safetensors"
    dsaio.save({k: v.contiguous() for k, v in state.items()}, output)
    return output


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
    parser = argparse.ArgumentParser(prog="zero_to_fp32", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="the directory with 'latest' (dstrain's or DeepSpeed's)")
    parser.add_argument("output_file", help="a .safetensors file, or a directory (model.safetensors inside)")
    parser.add_argument("--tag", default=None, help="sub-directory of checkpoint_dir (default: the 'latest' file)")
    parser.add_argument("--exclude_frozen_parameters", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_file, args.tag,
                                                         args.exclude_frozen_parameters)
    except (DstrainError, dszero.CheckpointError, OSError) as exc:
        parser.exit(1, f"zero_to_fp32: {exc}\n")
    print(f"zero_to_fp32: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["convert_zero_checkpoint_to_fp32_state_dict", "get_fp32_state_dict_from_zero_checkpoint",
           "load_state_dict_from_zero_checkpoint"]
