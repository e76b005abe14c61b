"""One user request in flight: its parts, the thread pool that runs them, and its completion."""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import threading
from contextlib import ExitStack

import numpy as np

from ._buffers import RawBuffer
from ._files import OpenFile, writing
from ._transfer import move
from .engines import Engine, Tuning
from .errors import AioError


def split_points(offset: int, nbytes: int, parts: int, alignment: int) -> list[tuple[int, int]]:
    """(offset, nbytes) of up to `parts` pieces, cut at aligned file offsets so that only the
    first and last piece can have an unaligned edge."""
    end = offset + nbytes
    cuts = [offset]
    for i in range(1, parts):
        cut = min(end, -(-(offset + nbytes * i // parts) // alignment) * alignment)
        if cut > cuts[-1]:
            cuts.append(cut)
    cuts.append(end)
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(cuts) if hi > lo] or [(offset, 0)]


class Op:
    """A request split into parts; the last part to finish closes the file and runs `finish`."""

    def __init__(self, engine: Engine, f: OpenFile, raw: RawBuffer, offset: int, is_read: bool,
                 tuning: Tuning, operation: str, parallelism: int, validate: bool) -> None:
        self.f, self.raw, self.offset, self.is_read = f, raw, offset, is_read
        self.engine, self.tuning, self.operation, self.validate = engine, tuning, operation, validate
        self.parts = split_points(offset, raw.nbytes, parallelism, f.align.offset)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._left = len(self.parts)
        self._lock = threading.Lock()
        self._stack = ExitStack()
        self._state = None
        if not is_read:  # registered before any part runs, see _files.writing
            self._state = self._stack.enter_context(writing(f, offset, offset + raw.nbytes, operation))

    def run_part(self, index: int) -> None:
        off, n = self.parts[index]
        try:
            move(self.engine, self.f, self.raw.addr + (off - self.offset), n, off, self.is_read,
                 self.tuning, self.operation, (self.offset, self.raw.nbytes), self._state)
        except BaseException as exc:
            with self._lock:
                self.error = self.error or exc
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        try:
            self._stack.close()
            if self.error is None and self.validate:
                self._check_against_file()
            if self.error is None and self.raw.finish is not None:
                self.raw.finish()
        except BaseException as exc:
            self.error = self.error or exc
        finally:
            self.f.close()
            self.raw = None  # type: ignore[assignment]  # let the caller's buffer go
            self.done.set()

    def _check_against_file(self) -> None:
        """DeepSpeed's `validate`: compare the buffer with the file through a plain read."""
        n = self.raw.nbytes
        ours = np.frombuffer((ctypes.c_char * n).from_address(self.raw.addr), dtype=np.uint8) if n else b""
        theirs = _plain_read(self.f.fd, n, self.offset)
        if len(theirs) != n or (n and not np.array_equal(ours, np.frombuffer(theirs, dtype=np.uint8))):
            raise AioError(errno.EIO, self.f.path, self.operation,
                           f"validation failed: the {n} bytes at offset {self.offset} differ from the buffer")


def _plain_read(direct_fd: int, n: int, offset: int) -> bytes:
    # A second, buffered descriptor of the same file: O_DIRECT refuses unaligned reads.
    fd = os.open(f"/proc/self/fd/{direct_fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)

