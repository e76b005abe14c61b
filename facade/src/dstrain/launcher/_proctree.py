"""Find and stop every process below a pid, from /proc (Linux), with the standard library only.

torchrun starts each rank in a session of its own, and a rank may start helpers (data-loader
workers) in turn, so signalling one process group is not enough to stop a job. The tree is
snapshotted before anything is signalled (once a parent dies its children are re-parented and the
link is lost), and each pid is remembered with its start time so a recycled pid is never killed.

This file is also run by path inside the node agent, so it imports nothing from dstrain.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid that cannot have been recycled

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of our descendants are re-parented to us instead of init, so we can still find them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    return int(fields[1]), int(fields[19]), fields[0]


def _parents() -> dict[int, int]:
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st[0]
    return table


def descendants(*roots: int) -> list[Proc]:
    """Every live process below `roots` (not the roots themselves), parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[Proc] = []
    todo = [c for r in roots for c in children.get(r, [])]
    seen: set[int] = set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        st = _stat(pid)
        if st is not None:
            found.append((pid, st[1]))
            todo.extend(children.get(pid, []))
    return found


def with_start_time(pid: int) -> list[Proc]:
    st = _stat(pid)
    return [] if st is None else [(pid, st[1])]


def alive(procs: list[Proc]) -> list[Proc]:
    """Those of `procs` still running (the same process, not a recycled pid, and not a zombie)."""
    live = []
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            live.append((pid, start))
    return live


def signal_all(procs: list[Proc], sig: int) -> None:
    for pid, _ in alive(procs):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def wait_gone(procs: list[Proc], timeout: float) -> list[Proc]:
    """Wait until none of `procs` runs or `timeout` passes; return those still running."""
    deadline = time.monotonic() + timeout
    live = alive(procs)
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = alive(live)
    return live


def kill_all(procs: list[Proc]) -> None:
    signal_all(procs, signal.SIGKILL)


def reap_orphans() -> None:
    """Collect exit statuses of re-parented orphans (a subreaper must, or they stay zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
