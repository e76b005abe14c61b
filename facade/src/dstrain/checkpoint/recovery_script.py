"""The `zero_to_fp32.py` a ZeRO save leaves beside its checkpoints, as DeepSpeed's does, so that
`python zero_to_fp32.py . out/` run in the checkpoint folder consolidates the weights into one fp32 state dict
(pytorch_model.bin, or model.safetensors). It runs dstrain's converter, which reads dstrain's and DeepSpeed's
checkpoints alike; it needs dstrain where it runs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dszero.checkpoint import write_text_atomically

from ..logs import logger

RECOVERY_SCRIPT = "zero_to_fp32.py"

_SCRIPT = '''#!/usr/bin/env python3
"""Written by dstrain's save_checkpoint beside its checkpoints, as DeepSpeed writes its zero_to_fp32.py:
consolidates the ZeRO checkpoint named by 'latest' (or -t TAG) into one fp32 state dict.

    python zero_to_fp32.py . output_dir/ [-t TAG] [--safe_serialization] [--max_shard_size 5GB]

Needs dstrain installed (pip install dstrain); `python -m dstrain.compat.utils.zero_to_fp32` is the same command.
"""
import sys

from dstrain.compat.utils.zero_to_fp32 import main

sys.exit(main())
'''


def write_recovery_script(save_dir: str | os.PathLike) -> Path:
    """`save_dir/zero_to_fp32.py`, replaced whole (a link planted there is replaced, never written through),
    created executable (0o755 less the umask)."""
    path = Path(save_dir) / RECOVERY_SCRIPT
    write_text_atomically(path, _SCRIPT, mode=0o755)
    return path


def make_executable(path: str | os.PathLike) -> None:
    """Add the execute bits; where the file system refuses (Azure file shares, a file gone), say so and go on:
    `python zero_to_fp32.py` works without them."""
    try:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except (FileNotFoundError, PermissionError) as exc:
        logger.info(f"could not make {path} executable ({exc}); run it with python instead")
