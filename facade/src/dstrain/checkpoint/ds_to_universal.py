"""`ds_to_universal`: convert a checkpoint (DeepSpeed's or dstrain's) to DeepSpeed's universal layout.

    python -m dstrain.checkpoint.ds_to_universal --input_folder CKPT/global_step100 \
        --output_folder CKPT/global_step100_universal

The input folder is one tag's directory, or a checkpoint root whose `latest` names one. The output is
a new folder, named in `latest_universal` beside it; DeepSpeed loads it with
`"checkpoint": {"load_universal": true}` at any data-parallel size, and dstrain at any layout. Under
`import dstrain.as_deepspeed` the module is also `deepspeed.checkpoint.ds_to_universal`.

DeepSpeed's arguments are accepted. Every tensor is read whole in one pass, so there is no fragment
extraction or slice merging: --num_extract_workers sets the threads that write the parameters' files,
--num_merge_workers is accepted and unused, --keep_temp_folder keeps the half-written `<out>.partial`
folder when a conversion fails, --no_strict writes parameters that have weights but no optimizer state,
and --inject_missing_state is accepted (the universal information is always written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import CheckpointLoadError, DstrainError
from .contents import WholeCheckpoint
from .deepspeed.files import is_deepspeed_directory
from .deepspeed.reader import read_deepspeed
from .files import COMMON_FILE
from .paths import read_latest, tag_directory
from .universal.writer import write_universal
from .whole import read_whole


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ds_to_universal", description=__doc__.splitlines()[0])
    parser.add_argument("--input_folder", type=str, required=True,
                        help="a checkpoint's tag directory (DeepSpeed's or dstrain's), or its root with 'latest'")
    parser.add_argument("--output_folder", type=str, required=True, help="the universal checkpoint to write (new)")
    parser.add_argument("--num_extract_workers", type=int, default=4, help="threads writing the parameters' files")
    parser.add_argument("--num_merge_workers", type=int, default=2, help="accepted for DeepSpeed's command line; "
                                                                         "nothing is merged here")
    parser.add_argument("--keep_temp_folder", action="store_true",
                        help="keep the half-written <output>.partial folder when the conversion fails")
    parser.add_argument("--no_strict", dest="strict", action="store_false",
                        help="write parameters that have weights but no optimizer state")
    parser.add_argument("--inject_missing_state", action="store_true",
                        help="accepted for DeepSpeed's command line; the universal information is always written")
    return parser.parse_args(argv)


def read_checkpoint(folder: str | Path) -> WholeCheckpoint:
    """The checkpoint at `folder` (a tag directory, or a root whose `latest` names one), whole: dstrain's at
    any data / tensor / pipeline / expert layout (read_whole), or DeepSpeed's (read_deepspeed)."""
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointLoadError(f"{path}: no such directory")
    if not ((path / COMMON_FILE).is_file() or is_deepspeed_directory(path)):
        tag = read_latest(path)
        if tag is not None:
            path = tag_directory(path, tag)
    if (path / COMMON_FILE).is_file():
        return read_whole(path)
    if is_deepspeed_directory(path):
        return read_deepspeed(path)
    raise CheckpointLoadError(f"{path}: neither a dstrain checkpoint ({COMMON_FILE}) nor a DeepSpeed one "
                              f"(mp_rank_XX_model_states.pt ...), and no 'latest' file names one")


def _arguments(args: object) -> argparse.Namespace:
    """`args` as parse_arguments' namespace: None or a list of strings is a command line; any other object is read
    by attribute, as DeepSpeed's main reads it (its own tests pass a `types.SimpleNamespace`)."""
    if args is None or isinstance(args, (list, tuple)):
        return parse_arguments(None if args is None else list(args))
    if isinstance(args, (str, bytes, dict)):
        raise TypeError(f"ds_to_universal.main: args must be a list of command-line strings or a namespace with "
                        f"input_folder and output_folder attributes, not a {type(args).__name__}")
    missing = [name for name in ("input_folder", "output_folder") if getattr(args, name, None) is None]
    if missing:
        raise TypeError(f"ds_to_universal.main: args ({type(args).__name__}) has no {' or '.join(missing)}; "
                        f"it needs input_folder and output_folder (e.g. argparse.Namespace(input_folder=..., "
                        f"output_folder=...))")
    # The optional arguments a caller's namespace leaves out take the command line's defaults.
    defaults = vars(parse_arguments(["--input_folder", "", "--output_folder", ""]))
    values = {name: getattr(args, name, default) for name, default in defaults.items()
              if name not in ("input_folder", "output_folder")}
    workers = values["num_extract_workers"]
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"ds_to_universal.main: num_extract_workers={workers!r}; it must be an integer")
    return argparse.Namespace(input_folder=args.input_folder, output_folder=args.output_folder, **values)


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    args = _arguments(args)
    try:
        whole = read_checkpoint(args.input_folder)
        out = write_universal(whole, args.output_folder, workers=args.num_extract_workers,
                              keep_partial=args.keep_temp_folder, strict=args.strict)
    except (DstrainError, ValueError, OSError) as exc:
        print(f"ds_to_universal: {exc}", file=sys.stderr)
        return 1
    print(f"ds_to_universal: wrote {out} ({len(whole.parameters)} parameters, step "
          f"{whole.progress.get('global_steps', 0)}) from {whole.source} checkpoint {whole.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
