"""Opening files for direct I/O, and the per-file state that concurrent writes share: the reservation
of the blocks a write adds (see _reserve) and the cut of the padding unaligned tails leave."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ._align import Alignment, alignment_of_fd
from ._reserve import reserve
from .errors import AioError

_BUFFERED = Alignment(1, 1, False, "O_DIRECT refused by this file system; buffered I/O")
_O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass
class OpenFile:
    path: str
    fd: int
    align: Alignment
    size_at_open: int
    key: tuple[int, int]  # (device, inode): identifies the file across paths and handles
    created: bool = False  # this open made the file: a write that cannot reserve its space removes it

    def close(self) -> None:
        os.close(self.fd)


def open_fd(fd: int, operation: str) -> OpenFile:
    """Wraps a caller's open descriptor (DeepSpeed's fd overload); we work on a duplicate."""
    own = os.dup(fd)
    try:
        st = os.fstat(own)
        direct = bool(fcntl.fcntl(own, fcntl.F_GETFL) & _O_DIRECT)
        align = alignment_of_fd(own) if direct else _BUFFERED
    except BaseException:
        os.close(own)
        raise
    return OpenFile(f"<fd {fd}>", own, align, st.st_size, (st.st_dev, st.st_ino))


def open_file(path: str | os.PathLike | int, is_read: bool, operation: str) -> OpenFile:
    """Opens with O_DIRECT, or buffered where the file system refuses it (tmpfs, some FUSE).

    Writes open read-write without truncating, as DeepSpeed does: an unaligned edge of the
    range has to be read back and merged (see _transfer), and bytes past the range are kept.
    """
    if isinstance(path, int):
        return open_fd(path, operation)
    path = os.fspath(path)
    flags = (os.O_RDONLY if is_read else os.O_RDWR | os.O_CREAT) | os.O_CLOEXEC
    created = False
    try:
        if not is_read:  # learn whether we make the file (O_DIRECT below may refuse after creating it)
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
                created = True
        try:
            fd = os.open(path, flags | _O_DIRECT, 0o644)
            direct = bool(_O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            fd = os.open(path, flags, 0o644)
            direct = False
    except OSError as exc:
        raise AioError(exc.errno or errno.EIO, path, operation) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise AioError(errno.EISDIR if kind == "a directory" else errno.EINVAL, path, operation,
                           f"{path} is {kind}")
        align = alignment_of_fd(fd) if direct else _BUFFERED
        if not align.direct and direct:  # the fs says it has no DIO after all: reopen buffered
            os.close(fd)
            fd = os.open(path, flags, 0o644)
            align = _BUFFERED
    except BaseException:
        os.close(fd)
        raise
    return OpenFile(path, fd, align, st.st_size, (st.st_dev, st.st_ino), created)


@dataclass
class WriteState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    size_before: int = 0  # the file's size when the first of the current writers started
    max_end: int = 0  # the furthest byte any current writer will write
    writers: int = 0
    padded: bool = False  # an edge block was written whole past the end of the data


_states: dict[tuple[int, int], WriteState] = {}
_states_lock = threading.Lock()


@contextmanager
def writing(f: OpenFile, begin: int, end: int, operation: str) -> Iterator[WriteState]:
    """Registers a write of bytes [begin, end) for as long as it runs.

    Where the write extends the file, the new blocks are reserved first (see _reserve), rounded up
    to the direct-I/O alignment; a failure leaves the file as it was (and removes it if this
    request's open made it). An unaligned tail is written as a whole padded block. The padding
    (reserved or written) is cut off when the last writer of the file in this process finishes, at
    max(size before, furthest end written). Cutting earlier would leave an unaligned file size while
    other writers' O_DIRECT I/O is in flight, which makes ext4 fail synchronous direct reads of the
    file with EINVAL now and then. The lock serialises the read-merge-write of edge blocks that
    adjacent writes may share.
    """
    with _states_lock:
        size = os.fstat(f.fd).st_size
        state = _states.get(f.key)
        fresh = state is None
        if state is None:
            state = WriteState(size_before=size)
        if end > max(size, begin):
            lo = max(size, begin)
            hi = -(-end // f.align.offset) * f.align.offset
            try:
                reserve(f.fd, lo, hi - lo, f.path, operation)
            except BaseException:
                _restore(f, size, fresh)
                raise
            state.padded = state.padded or hi > end
        _states[f.key] = state
        state.writers += 1
        state.max_end = max(state.max_end, end)
    try:
        yield state
    finally:
        with _states_lock:
            state.writers -= 1
            if state.writers == 0:
                del _states[f.key]
                if state.padded:
                    keep = max(state.size_before, state.max_end)
                    if os.fstat(f.fd).st_size > keep:
                        os.ftruncate(f.fd, keep)


def _restore(f: OpenFile, size: int, fresh: bool) -> None:
    """Puts a file back as it was before a reservation that failed, perhaps partway."""
    with contextlib.suppress(OSError):
        if f.created and fresh and size == 0:
            st = os.stat(f.path)
            if (st.st_dev, st.st_ino) == f.key:  # still the file this request made, nobody else's
                os.unlink(f.path)
                return
        if os.fstat(f.fd).st_size > size:
            os.ftruncate(f.fd, size)
