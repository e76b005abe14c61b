"""The data region of a checkpoint, written with O_DIRECT as the tensors stream in.

A run of bytes whose memory address and file offset are both aligned for direct I/O is written
straight from the tensor: no copy. Everything else (tensors at addresses O_DIRECT refuses, as
torch's 64-byte-aligned allocations are when the disk wants 512; small tensors; the unaligned
tail of a tensor) is gathered into a small rotating set of aligned bounce buffers. Worker
threads write one buffer while the caller fills the next, so copying overlaps writing.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import Future, ThreadPoolExecutor

from .._buffers import aligned_empty
from .._files import OpenFile, WriteState
from .._transfer import move
from ..engines import Engine, Tuning

TUNING = Tuning(block_size=1 << 20, queue_depth=8, single_submit=False, overlap_events=True)
SLICE = 16 << 20  # one bounce buffer: many full-size blocks per write, small enough to rotate
BUFFERS = 4  # up to WRITERS in flight while the next ones fill
WRITERS = 2  # two writes in flight keep the queue full across the end of each one
DIRECT_MIN = 1 << 20  # smaller runs are cheaper copied than written as requests of their own


class DataStream:
    """Appends (address, nbytes) runs to the file from offset `start`; `with` waits for the writes."""

    def __init__(self, f: OpenFile, start: int, engine: Engine, state: WriteState) -> None:
        self.f, self.engine, self.state = f, engine, state
        self.pos = start  # file offset of the bounce buffer being filled
        self.fill = 0  # bytes in it
        self.offset_align, self.memory_align = f.align.offset, f.align.memory
        self.buffers = [aligned_empty(SLICE, max(self.memory_align, 4096)) for _ in range(BUFFERS)]
        self.in_flight: list[Future | None] = [None] * BUFFERS
        self.current = 0
        self.writes: list[Future] = []
        self.pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="dsaio-save")

    def _direct_ok(self, addr: int, nbytes: int, file_offset: int) -> bool:
        return (nbytes >= DIRECT_MIN and addr % self.memory_align == 0
                and file_offset % self.offset_align == 0)

    def write(self, addr: int, nbytes: int) -> None:
        done = 0
        while done < nbytes:
            src, left = addr + done, nbytes - done
            here = self.pos + self.fill
            if self._direct_ok(src, left, here):
                self._flush()  # the staged bytes end on an aligned offset: out they go first
                n = left - left % self.offset_align
                self._submit(src, n)
                self.pos += n
            else:
                n = min(left, SLICE - self.fill)
                # Copy only up to the next aligned offset when the rest could go out directly from there.
                skip = -here % self.offset_align
                if 0 < skip < n and self._direct_ok(src + skip, left - skip, here + skip):
                    n = skip
                self._copy_in(src, n)
            done += n

    def _copy_in(self, src: int, n: int) -> None:
        if self.fill == 0:
            waiting = self.in_flight[self.current]
            if waiting is not None:
                waiting.result()  # the buffer must be on disk before it is refilled
        ctypes.memmove(self.buffers[self.current].ctypes.data + self.fill, src, n)  # releases the GIL
        self.fill += n
        if self.fill == SLICE:
            self._flush()

    def _flush(self) -> None:
        if self.fill == 0:
            return
        buf = self.buffers[self.current]
        self.in_flight[self.current] = self._submit(buf.ctypes.data, self.fill)
        self.pos += self.fill
        self.fill = 0
        self.current = (self.current + 1) % BUFFERS

    def _submit(self, addr: int, n: int) -> Future:
        # Only the file's last write can end unaligned; move() pads and merges that edge.
        fut = self.pool.submit(move, self.engine, self.f, addr, n, self.pos, False, TUNING, "save", None, self.state)
        self.writes.append(fut)
        return fut

    def __enter__(self) -> DataStream:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            if exc_type is None:
                self._flush()
        finally:
            self.pool.shutdown(wait=True)  # no write may outlive the memory it reads
        if exc_type is None:
            for fut in self.writes:
                fut.result()  # the first error, if any
