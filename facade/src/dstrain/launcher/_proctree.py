"""Find and stop every process below a pid, from /proc (Linux), with the standard library only.

torchrun starts each rank in a session of its own, and a rank may start helpers (data-loader
workers) in turn, so signalling one process group is not enough to stop a job. The tree is
snapshotted before anything is signalled (once a parent dies its children are re-parented and the
link is lost), and each pid is remembered with its start time so a recycled pid is never killed.

Two kernel features keep a job from outliving whoever supervises it: a parent-death signal
(PR_SET_PDEATHSIG), armed in every process we start, and child subreapers (PR_SET_CHILD_SUBREAPER):
a process whose parent dies is re-parented to its nearest living subreaper ancestor instead of init,
and `sweep` stops what a subreaper adopts.

This file is also run by path inside the node agent, so it imports nothing from dstrain.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid that cannot have been recycled

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl():
    """libc's prctl, or None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def become_subreaper() -> bool:
    """Orphans of our descendants are re-parented to us instead of init, so we can still find them."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def set_parent_death_signal(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """This process gets `sig` when its parent dies, by whatever signal. `parent`: the pid it was started
    by; when that one is already gone (we were re-parented before this call), `sig` is sent now."""
    prctl = _prctl()
    if prctl is None or prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def dies_with_parent(sig: int = signal.SIGTERM):
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when this process dies, even by SIGKILL.

    The kernel sends it when the *thread* that started the child ends, so start children from a thread
    that lives as long as the process (ours all start from the main thread). The signal survives exec
    (not into a set-user-ID program); it is not inherited by the child's own children, which is why
    every process we start arms its own, and subreapers sweep the rest."""
    parent = os.getpid()
    prctl = _prctl()  # looked up before the fork: the child only makes the call

    def arm() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and here: do not start an orphan
            os._exit(1)

    return arm


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


def _below(table: dict[int, int], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [c for r in roots for c in children.get(r, [])]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def sweep(snapshot: list[Proc], timeout: float, *, own: tuple[int, ...] = (), everything: bool = False) -> list[Proc]:
    """Stop what is left below this process (a subreaper) and in `snapshot`, and return what had to be killed.

    `own`: our children that are being stopped by their own means (with what is below them). Anything
    else that is our child was adopted (its parent died) and gets SIGTERM as soon as it is seen, so an
    orphan is never left waiting; with `everything`, every process found gets SIGTERM. After `timeout`
    seconds, whatever still runs gets SIGKILL. Adopted processes are reaped; `own` ones are left for
    their Popen to wait on."""
    me = os.getpid()
    deadline = time.monotonic() + timeout
    tracked = set(snapshot)
    signalled: set[Proc] = set()
    while True:
        table = _parents()
        for pid in _below(table, {me}):
            st = _stat(pid)
            if st is not None:
                tracked.add((pid, st[1]))
        managed = set(own) | _below(table, set(own))
        live = alive(sorted(tracked))
        for proc in live:
            adopted = table.get(proc[0]) == me and proc[0] not in managed
            if proc not in signalled and (everything or adopted):
                signalled.add(proc)
                with contextlib.suppress(OSError):
                    os.kill(proc[0], signal.SIGTERM)
        _reap_adopted(table, me, set(own))
        if not live:
            return []
        if time.monotonic() >= deadline:
            kill_all(live)
            return live
        time.sleep(0.05)


def _reap_adopted(table: dict[int, int], me: int, own: set[int]) -> None:
    for pid, ppid in table.items():
        if ppid == me and pid not in own:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def reap_orphans() -> None:
    """Collect exit statuses of re-parented orphans (a subreaper must, or they stay zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
