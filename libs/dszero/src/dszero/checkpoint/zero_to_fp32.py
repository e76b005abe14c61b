"""`zero_to_fp32`: consolidate a sharded ZeRO checkpoint into one fp32 state dict (no GPU, no process group).

    zero_to_fp32 CHECKPOINT_DIR OUTPUT.safetensors [--tag TAG]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import dsaio

from ..errors import CheckpointError
from .sharded import ShardFiles, _layout_from_json, read_meta, resolve_directory


def _checkpoint_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> Path:
    root = Path(checkpoint_dir)
    if tag is None and (root / "latest").is_file():
        tag = (root / "latest").read_text().strip()
    return resolve_directory(root / tag if tag else root)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None
                                             ) -> dict[str, torch.Tensor]:
    """{parameter name: fp32 tensor} from every shard of the checkpoint."""
    path = _checkpoint_dir(checkpoint_dir, tag)
    meta = read_meta(path)
    files = ShardFiles(path, meta["world_size"])
    shards = [files.tensors(rank) for rank in range(meta["world_size"])]
    state: dict[str, torch.Tensor] = {}
    for index, data in enumerate(meta["layouts"]):
        layout = _layout_from_json(data)
        flat = torch.cat([shard[f"group{index}.master"] for shard in shards])
        for slot in layout.slots:
            state[slot.name] = flat[slot.offset:slot.end].view(slot.shape).clone()
    return state


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike, output_file: str | os.PathLike,
                                               tag: str | None = None) -> Path:
    """Write the consolidated fp32 weights as one safetensors file (a dsaio checkpoint file)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    output = Path(output_file)
    if output.is_dir():
        output = output / "model.safetensors"
    dsaio.save(state, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zero_to_fp32", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("output_file", help="a .safetensors file, or a directory (model.safetensors inside)")
    parser.add_argument("--tag", default=None, help="sub-directory of checkpoint_dir (default: the 'latest' file)")
    args = parser.parse_args(argv)
    try:
        out = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_file, args.tag)
    except CheckpointError as exc:
        parser.exit(1, f"zero_to_fp32: {exc}\n")
    print(f"zero_to_fp32: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
