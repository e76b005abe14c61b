"""How deep an I/O engine's queues may be on this machine, and how many threads a user may start: read
from the kernel's settings, so that a handle (and dszero's config check) refuses a queue_depth the
kernel would refuse only at the first transfer.

- aio (Linux native AIO): one queue holds at most /proc/sys/fs/aio-max-nr events, which is also the
  total over every queue of every process (io_setup fails with EAGAIN beyond it), and never more than
  the kernel's own cap of 4194304.
- io_uring: a ring holds at most 32768 entries (IORING_MAX_ENTRIES; io_uring_setup fails with EINVAL).
- threads: queue_depth is the number of worker threads per request: at most the threads this user may
  start (/proc/sys/kernel/threads-max and RLIMIT_NPROC).
- python: does not queue; no limit.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from .engines import get_engine

AIO_MAX_NR = "/proc/sys/fs/aio-max-nr"
THREADS_MAX = "/proc/sys/kernel/threads-max"
AIO_KERNEL_CAP = 4194304  # 0x10000000 / sizeof(struct io_event) / 2: io_setup's EINVAL bound
IO_URING_MAX_ENTRIES = 32768


@dataclass(frozen=True)
class QueueLimits:
    engine: str
    queue_depth: int | None  # the deepest one queue may be; None: no limit
    source: str  # where queue_depth comes from, for messages
    events: int | None  # events all queues together may hold (Linux AIO), None: no such limit
    threads: int | None  # threads this user may start; None: unknown or unlimited


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def threads_limit() -> int | None:
    limits = [_read_int(THREADS_MAX)]
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    limits.append(None if soft == resource.RLIM_INFINITY else soft)
    known = [value for value in limits if value is not None and value > 0]
    return min(known) if known else None


def queue_limits(engine: str | None = None) -> QueueLimits:
    """The limits of `engine` (default: the engine a handle would use here)."""
    name = get_engine(engine).name
    threads = threads_limit()
    if name == "aio":
        events = _read_int(AIO_MAX_NR)
        if events is None:
            return QueueLimits(name, AIO_KERNEL_CAP, "the kernel's cap on one AIO context", None, threads)
        return QueueLimits(name, min(events, AIO_KERNEL_CAP), f"{AIO_MAX_NR} is {events}", events, threads)
    if name == "io_uring":
        return QueueLimits(name, IO_URING_MAX_ENTRIES, "io_uring's IORING_MAX_ENTRIES", None, threads)
    if name == "threads":
        return QueueLimits(name, threads, "the threads this user may start", None, threads)
    return QueueLimits(name, None, "", None, threads)
