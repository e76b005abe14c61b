"""What happens to queued events when a process ends: they are written first.

The writer threads are daemon threads (a monitor must never keep a finished script alive), so the
interpreter stops them at exit wherever they are. Three paths get what was handed to a monitor
written before that:

- at interpreter exit, a hook per MonitorMaster holds its writers themselves (not the master), so a
  master dropped with the engine that made it (`def main(): engine = initialize(...)`, no destroy)
  still gets its queues written and its backends closed;
- when a master is garbage-collected without close(), its writers are told to drain (write what is
  queued, flush the backend, end the thread) without anyone waiting for them;
- on SIGTERM (what torchrun and dstrain's launcher send to stop a rank): a handler, installed where
  the process had SIGTERM's default action, writes every open monitor for at most
  `SIGTERM_FLUSH_SECONDS` and then lets the signal's default action end the process, so its exit
  status is still "killed by SIGTERM". A main thread busy in native code (a collective that waits
  for a dead peer) cannot run a Python handler, so a watcher thread woken by the signal itself
  (`signal.set_wakeup_fd`) does the same from outside it. A handler the script installs itself
  takes precedence (a script that exits from it still gets the exit path).

Writing never blocks training: the caller's side is still a queue append; only an ending process
waits for the writers.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .writer import BackendWorker

logger = logging.getLogger("dsmonitor")

SIGTERM_FLUSH_SECONDS = 5.0  # a stopping job's SIGKILL follows SIGTERM after a grace period (dstrain's: 10 s)

_open: set[BackendWorker] = set()  # writers whose backends are not closed yet, in every live or dropped master
_lock = threading.Lock()
_ending = threading.Lock()  # held by whoever writes everything on SIGTERM; the process ends with it held
_installed_in: list[int] = []  # the pid that installed the SIGTERM handler (a forked child does not inherit it)
_wakeup_fd: list[int] = []  # the write end of the watcher's pipe, where we set it


def track(workers: Iterable[BackendWorker]) -> None:
    with _lock:
        _open.update(workers)


def untrack(workers: Iterable[BackendWorker]) -> None:
    with _lock:
        _open.difference_update(workers)


def close_workers(workers: Iterable[BackendWorker], timeout: float | None) -> None:
    """Write what each of `workers` holds and close its backend (each within `timeout`). Every writer is asked
    first, so they drain side by side."""
    workers = list(workers)
    for worker in workers:
        worker.request_stop()
    for worker in workers:
        worker.close(timeout)
    untrack(workers)


def drain(workers: Iterable[BackendWorker]) -> None:
    """A master dropped without close(): its writers write what is queued, flush and end, waited for by nobody.
    Their backends are closed at exit."""
    for worker in workers:
        worker.request_stop()


def close_all(timeout: float) -> None:
    """Every open monitor of the process, within `timeout` seconds in all (SIGTERM's path)."""
    import time

    with _lock:
        workers = list(_open)
    deadline = time.monotonic() + timeout
    for worker in workers:  # each drains on its own thread: ask all first, then wait for each
        worker.request_stop()
    for worker in workers:
        worker.close(max(deadline - time.monotonic(), 0.0))
    untrack(workers)


# ---------------------------------------------------------------------------------------------- SIGTERM
def install_sigterm_flush() -> bool:
    """Write every open monitor on SIGTERM before the process ends (see the module's docstring). Installed
    once per process, from the main thread, and only where SIGTERM still has its default action."""
    if _installed_in and _installed_in[0] == os.getpid():
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the script's (or torch's) own handler decides what SIGTERM does
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous not in (None, -1):  # someone else's (asyncio's): leave it; the main-thread handler still runs
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
    else:
        _wakeup_fd[:] = [write_end]
        threading.Thread(target=_watch, args=(read_end,), name="dsmonitor-sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed_in[:] = [os.getpid()]
    if not _fork_hook_registered:
        _register_fork_hook()
    return True


def _on_sigterm(signum: int, frame: object) -> None:
    _write_and_die(in_main_thread=True)


def _watch(read_end: int) -> None:
    """The watcher: woken by every signal that has a Python handler; acts on SIGTERM while ours is installed."""
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm \
                and _installed_in == [os.getpid()]:
            _write_and_die(in_main_thread=False)


def _write_and_die(in_main_thread: bool) -> None:
    if not _ending.acquire(blocking=False):
        if in_main_thread:  # the watcher is writing: wait for it to end the process
            _ending.acquire()
        return
    try:
        close_all(SIGTERM_FLUSH_SECONDS)
    except Exception as exc:  # a broken backend must not keep a stopped process alive
        logger.error("dsmonitor: writing the monitors on SIGTERM failed (%s: %s)", type(exc).__name__, exc)
    finally:
        _default_action_now(in_main_thread)


def _default_action_now(in_main_thread: bool) -> None:
    """End the process as SIGTERM's default action would (its exit status says SIGTERM)."""
    if in_main_thread:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:  # signal.signal() is the main thread's only; libc's is anyone's
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(0))  # SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached: the default action ends the process first


_fork_hook_registered = False


def _register_fork_hook() -> None:
    global _fork_hook_registered
    _fork_hook_registered = True
    os.register_at_fork(before=_block_sigterm, after_in_parent=_unblock_sigterm, after_in_child=_forget_in_child)


_mask_before_fork: list[set] = []


def _block_sigterm() -> None:
    """SIGTERM is held back across a fork: a child signalled before its after-fork hook has run would otherwise
    run our handler (which is not for it) or wake our watcher through the pipe it shares with us."""
    if _installed_in:
        _mask_before_fork[:] = [signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})]


def _unblock_sigterm() -> None:
    if _mask_before_fork:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork.pop())


def _forget_in_child() -> None:
    """A forked child (a data-loader worker) has none of our writer threads: SIGTERM goes back to its default
    action there and our watcher's pipe is let go, then SIGTERM is let through (one sent meanwhile ends it)."""
    global _lock, _ending
    _lock, _ending = threading.Lock(), threading.Lock()  # another thread may have held them at the fork
    _open.clear()
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _wakeup_fd:
            previous = signal.set_wakeup_fd(-1)
            if previous != _wakeup_fd[0]:
                signal.set_wakeup_fd(previous)  # not ours (the child set its own): put it back
    _unblock_sigterm()
