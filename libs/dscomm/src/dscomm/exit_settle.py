"""Let gloo's worker threads finish with Python objects before the interpreter starts to finalize.

A gloo worker thread drops its reference to a collective's work after the waiting Python thread has
already moved on. When Python let go of a tensor of that work first, the last reference is the
worker's, and dropping it takes the GIL to free the tensor's Python object. Once the interpreter is
finalizing, a thread that asks for the GIL is made to exit, from inside a C++ destructor, and the
process aborts with `terminate called without an active exception` — a run that trained and saved
everything, reported as failed. Seen under load, at the exit of a script whose last act was a
collective (a 2-rank job on a busy machine, about 1 run in 10).

Exit functions run while the interpreter is still whole, so one registered here (at import, so after
the script's own, which run first) sleeps in short steps, giving up the GIL, until no other thread of
the process is runnable: a worker that was about to free a tensor has then done so. It waits at most
`SETTLE_LIMIT_S`; where /proc is missing it sleeps one step.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

SETTLE_LIMIT_S = 1.0
_STEP_S = 0.002
# A thread blocked on the GIL (taken by this one while it reads /proc) sleeps on a futex, state S, though it
# is about to run: only several quiet looks in a row, each after a sleep that hands it the GIL, mean idle.
_QUIET_LOOKS = 3


def _other_threads_runnable(own_tid: int) -> bool:
    """Whether a thread of this process other than `own_tid` is running or waiting for a CPU (state R)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        if int(tid) == own_tid:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # the thread ended meanwhile
        # The state follows the command name, which is in parentheses and may hold spaces.
        state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
        if state == b"R":
            return True
    return False


def settle_threads(limit_s: float = SETTLE_LIMIT_S) -> float:
    """Give up the GIL in short sleeps until no other thread is runnable or `limit_s` passed; returns
    the seconds waited."""
    began = time.monotonic()
    own = threading.get_native_id()
    quiet = 0
    while True:
        time.sleep(_STEP_S)
        waited = time.monotonic() - began
        quiet = 0 if _other_threads_runnable(own) else quiet + 1
        if waited >= limit_s or quiet >= _QUIET_LOOKS:
            return waited


def _settle_at_exit() -> None:
    if "torch.distributed" in sys.modules:  # no process group, no gloo threads
        settle_threads()


atexit.register(_settle_at_exit)
