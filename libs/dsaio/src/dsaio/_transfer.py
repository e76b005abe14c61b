"""One request of any size, offset and buffer address, made of aligned direct-I/O pieces.

A range [offset, offset + nbytes) splits into an unaligned head block, an aligned middle and an
unaligned tail block. The middle goes straight between the caller's memory and the file when the
caller's address lines up with the file offset, else through an aligned bounce buffer. Edge blocks
always go through a bounce block: a read copies out the bytes asked for; a write reads the block
back, merges and writes it whole; padding past the end of the data is cut off later.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time

from ._buffers import aligned_empty
from ._files import OpenFile, WriteState, writing
from .engines import Engine, Tuning
from .errors import AioError, short_read

_EINVAL_PAUSES = (0.0001, 0.001, 0.01, 0.1)
_MAX_BOUNCE = 64 << 20  # memory a misaligned request may add, per piece in flight


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def _down(x: int, a: int) -> int:
    return x - x % a


class _Request:
    def __init__(self, engine: Engine, f: OpenFile, tuning: Tuning, operation: str) -> None:
        self.engine, self.f, self.tuning, self.operation = engine, f, tuning, operation

    def io(self, addr: int, nbytes: int, offset: int, is_read: bool) -> int:
        got = self.engine.transfer(self.f.fd, addr, nbytes, offset, is_read, self.tuning)
        # ext4 now and then refuses an aligned synchronous O_DIRECT read with EINVAL while other
        # descriptors write around it (seen with the pread engines and adjacent unaligned async
        # writes); the same read succeeds a moment later. Retry briefly rather than fail.
        for pause in _EINVAL_PAUSES:
            if got != -errno.EINVAL or not is_read or not self.f.align.direct:
                break
            time.sleep(pause)
            got = self.engine.transfer(self.f.fd, addr, nbytes, offset, is_read, self.tuning)
        if got < 0:
            raise AioError(-got, self.f.path, self.operation)
        return got

    def short(self, wanted_end: int, got_end: int, offset: int, nbytes: int) -> AioError:
        size_now = os.fstat(self.f.fd).st_size
        if self.f.size_at_open >= wanted_end:
            return AioError(errno.EIO, self.f.path, self.operation,
                            f"file changed size during the read: {self.f.size_at_open} bytes when opened, "
                            f"{size_now} now; {nbytes} bytes wanted at offset {offset}")
        return short_read(self.f.path, self.operation, nbytes, offset, size_now)

    def middle(self, addr: int, nbytes: int, offset: int, is_read: bool, req: tuple[int, int]) -> None:
        """An aligned file range; `addr` may or may not be aligned in memory."""
        align = self.f.align
        if addr % align.memory == 0:
            got = self.io(addr, nbytes, offset, is_read)
            if is_read and got < nbytes:
                raise self.short(offset + nbytes, offset + got, *req)
            return
        chunk = min(_up(nbytes, align.offset), max(align.offset, _down(_MAX_BOUNCE, align.offset)),
                    max(_up(self.tuning.block_size * self.tuning.queue_depth, align.offset), 1 << 20))
        bounce = aligned_empty(chunk, align.memory)
        baddr = bounce.ctypes.data
        for start in range(0, nbytes, chunk):
            n = min(chunk, nbytes - start)
            if is_read:
                got = self.io(baddr, n, offset + start, True)
                ctypes.memmove(addr + start, baddr, min(got, n))
                if got < n:
                    raise self.short(offset + nbytes, offset + start + got, *req)
            else:
                ctypes.memmove(baddr, addr + start, n)
                self.io(baddr, n, offset + start, False)

    def edge(self, addr: int, lo: int, hi: int, is_read: bool, req: tuple[int, int]) -> bool:
        """Bytes [lo, hi) of one alignment block, `addr` holding byte `lo`. Returns whether a
        write grew the file past `hi` with padding."""
        align = self.f.align
        block_off = _down(lo, align.offset)
        bounce = aligned_empty(align.offset, align.memory)
        baddr = bounce.ctypes.data
        got = self.io(baddr, align.offset, block_off, True)
        if is_read:
            if block_off + got < hi:
                raise self.short(hi, block_off + got, *req)
            ctypes.memmove(addr, baddr + (lo - block_off), hi - lo)
            return False
        bounce[got:] = 0  # past the end of the file: the padding we will cut off again
        ctypes.memmove(baddr + (lo - block_off), addr, hi - lo)
        self.io(baddr, align.offset, block_off, False)
        return block_off + align.offset > max(hi, block_off + got)


def move(engine: Engine, f: OpenFile, addr: int, nbytes: int, offset: int, is_read: bool,
         tuning: Tuning, operation: str, req: tuple[int, int] | None = None,
         state: WriteState | None = None) -> None:
    """Reads or writes all `nbytes`, or raises AioError.

    When this is one piece of a larger request, `req` is the user's (offset, nbytes), for
    messages, and a write passes the `state` under which the whole request was registered.
    """
    if nbytes == 0:
        return
    if not is_read and state is None:
        with writing(f, offset, offset + nbytes, operation) as own:
            return move(engine, f, addr, nbytes, offset, False, tuning, operation, req, own)
    r = _Request(engine, f, tuning, operation)
    req = req or (offset, nbytes)
    a = f.align.offset
    end = offset + nbytes
    mid_lo, mid_hi = _up(offset, a), _down(end, a)
    if mid_lo > mid_hi:
        edges = [(offset, end)]  # the whole request lies inside one block
    else:
        edges = []
        if offset % a:
            edges.append((offset, mid_lo))
        if end % a:
            edges.append((mid_hi, end))
    if mid_hi > mid_lo:
        r.middle(addr + (mid_lo - offset), mid_hi - mid_lo, mid_lo, is_read, req)
    if not edges:
        return
    if is_read:
        for lo, hi in edges:
            r.edge(addr + (lo - offset), lo, hi, True, req)
        return
    assert state is not None
    with state.lock:
        for lo, hi in edges:
            if r.edge(addr + (lo - offset), lo, hi, False, req):
                state.padded = True  # cut off by the last writer, see _files.writing
