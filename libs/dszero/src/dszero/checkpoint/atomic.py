"""Crash-safe file system steps of a checkpoint: a directory swapped into place, a small file replaced
atomically, both made durable (the directory entry fsynced)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def swap_into_place(partial: Path, final: Path) -> None:
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_text_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """`path` holds `text` (permissions `mode`, less the umask), replaced in one rename. The temporary file is
    created new: a stale one, or a link planted under its name, is removed rather than written through."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.rename(path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
