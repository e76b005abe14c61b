"""Who owns an NVMe swap directory, and removing those whose owner is gone.

A run removes its swap directories when it ends, but a killed run cannot, and its files stay on the
fast disk (8 kills left 97 MB). So each directory holds a marker, owner.json, naming its owner: pid,
host, boot id, pid namespace and the process's start time (which tells a reused pid from the owner).
When a swap file is made, the directories beside it whose owner is on this host, in this boot and pid
namespace, and no longer running (or a zombie, or a different process under the same pid) are removed,
and the removal is logged with the bytes it freed. A directory of a live process, of another host,
boot or container, or without a readable marker is never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("dszero")

MARKER = "owner.json"
SWAP_DIR = re.compile(r"\.?dszero_(optimizer|params)_rank\d+_[^/]*")  # a leading dot: one being removed


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) of a process, from /proc; None when unknown."""
    text = _read(f"/proc/{pid}/stat")
    if text is None or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    try:
        return fields[0], int(fields[19])  # stat fields 3 (state) and 22 (starttime)
    except (IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def identity() -> dict[str, Any]:
    """This process, as a marker records it."""
    me = _process(os.getpid())
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": _read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace(), "start_time": me[1] if me else None}


def make_swap_dir(parent: Path, prefix: str) -> Path:
    """A new private directory under `parent`, marked as this process's."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    # Written whole or not at all: a half-written marker would read as no owner, and be left alone.
    partial = directory / f".{MARKER}.partial"
    partial.write_text(json.dumps(identity()))
    os.replace(partial, directory / MARKER)
    return directory


def _owner(directory: Path) -> dict[str, Any] | None:
    text = _read(str(directory / MARKER))
    try:
        owner = json.loads(text) if text else None
    except ValueError:
        return None
    return owner if isinstance(owner, dict) else None


def owner_is_gone(owner: dict[str, Any], me: dict[str, Any]) -> bool:
    """Whether the owner surely no longer runs; False whenever that cannot be told from here."""
    same_place = all(owner.get(k) == me[k] and me[k] is not None for k in ("host", "boot_id", "pid_ns"))
    pid = owner.get("pid")
    if not same_place or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process: it runs
    now = _process(pid)
    if now is None:
        return False
    state, started = now
    if state in ("Z", "X"):  # killed, not yet reaped by its parent: it will not touch its files again
        return True
    return owner.get("start_time") is not None and started != owner["start_time"]  # the pid was reused


def _disk_bytes(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def remove_stale(parent: Path) -> list[tuple[Path, int]]:
    """Removes the swap directories in `parent` left by processes that are gone; (directory, bytes freed)."""
    me = identity()
    removed = []
    try:
        candidates = sorted(parent.iterdir())
    except OSError:
        return removed
    for directory in candidates:
        if not SWAP_DIR.fullmatch(directory.name) or directory.is_symlink() or not directory.is_dir():
            continue
        owner = _owner(directory)
        if owner is None or not owner_is_gone(owner, me):
            continue
        nbytes = _disk_bytes(directory)
        # Claimed by a rename first, so two ranks starting together do not both remove it.
        claimed = directory.with_name(f".{directory.name.lstrip('.')}.removing-{os.getpid()}")
        try:
            os.rename(directory, claimed)
        except OSError:
            continue
        shutil.rmtree(claimed, ignore_errors=True)
        removed.append((directory, nbytes))
        log.warning("dszero: removed the stale NVMe swap directory %s of process %s on %s, which is gone "
                    "(killed?): %.1f MB freed", directory, owner["pid"], owner["host"], nbytes / 1e6)
    return removed
