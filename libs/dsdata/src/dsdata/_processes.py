"""A forked map process ends with the analyzer that forked it, even when that one is killed (SIGKILL)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


def end_with_parent(parent: int) -> None:
    """In a forked child of `parent`: have the kernel SIGKILL this process when the parent dies (Linux), or
    else a thread that ends it once it has been re-parented. Either way a parent that died before this
    call is caught by the check after it."""
    if not _parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch, args=(parent,), daemon=True, name="dsdata-parent-watch").start()
    if os.getppid() != parent:
        os._exit(1)


def _parent_death_signal(signum: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    os._exit(1)
