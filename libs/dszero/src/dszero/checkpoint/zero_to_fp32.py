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
from .shard_index import ShardIndex
from .sharded import read_meta, resolve_directory


def _checkpoint_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> Path:
    root = Path(checkpoint_dir)
    if tag is None and (root / "latest").is_file():
        tag = (root / "latest").read_text().strip()
    return resolve_directory(root / tag if tag else root)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None
                                             ) -> dict[str, torch.Tensor]:
    """{parameter name: fp32 tensor} from every shard of the checkpoint."""
    path = _checkpoint_dir(checkpoint_dir, tag)
    read_meta(path)  # verifies the manifest
    index = ShardIndex(path)
    state: dict[str, torch.Tensor] = {}
    for layout, shards in index.complete_groups():
        flat = torch.cat([index.tensor(shards[r][0], "master") for r in range(layout.world_size)]).float()
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
