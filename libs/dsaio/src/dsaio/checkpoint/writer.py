"""Writing a checkpoint file atomically, streaming through aligned buffers with O_DIRECT.

Data goes out in CHUNK-sized pieces: the calling thread copies tensors into one aligned buffer
and checksums it while a worker thread writes the previous buffer. The header, which holds the
checksums, goes last. Then: fsync the file, rename it over the target, fsync the directory. A
crash at any point before the rename leaves the previous file as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

from .._buffers import aligned_empty
from .._files import OpenFile, open_file, writing
from .._transfer import move
from ..engines import Tuning, get_engine
from .format import CHUNK, Entry, encode_header, index_crc

TUNING = Tuning(block_size=1 << 20, queue_depth=8, single_submit=False, overlap_events=True)


def _temp_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.dsaio-tmp-{os.getpid()}-{secrets.token_hex(4)}")


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Stream:
    """Copies (address, nbytes) pieces into aligned chunks and writes each chunk as it fills."""

    def __init__(self, f: OpenFile, start: int, engine_name: str | None, state) -> None:
        self.f, self.pos, self.state = f, start, state
        self.engine = get_engine(engine_name)
        self.buffers = [aligned_empty(CHUNK, max(f.align.memory, 4096)) for _ in range(2)]
        self.pending: list[Future | None] = [None, None]
        self.current, self.fill = 0, 0
        self.crcs: list[str] = []
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dsaio-save")

    def add(self, addr: int, nbytes: int) -> None:
        done = 0
        while done < nbytes:
            buf = self.buffers[self.current]
            n = min(nbytes - done, CHUNK - self.fill)
            ctypes.memmove(buf.ctypes.data + self.fill, addr + done, n)
            self.fill += n
            done += n
            if self.fill == CHUNK:
                self.flush()

    def flush(self) -> None:
        if self.fill == 0:
            return
        i, n = self.current, self.fill
        buf = self.buffers[i]
        self.crcs.append(f"{zlib.crc32(buf[:n]):08x}")  # while the other buffer is being written
        self.pending[i] = self.pool.submit(move, self.engine, self.f, buf.ctypes.data, n, self.pos, False,
                                           TUNING, "save", None, self.state)
        self.pos += n
        self.current, self.fill = 1 - i, 0
        waiting = self.pending[self.current]
        if waiting is not None:
            waiting.result()  # the buffer we fill next must be on disk first
            self.pending[self.current] = None

    def close(self) -> None:
        try:
            self.flush()
            for fut in self.pending:
                if fut is not None:
                    fut.result()
        finally:
            self.pool.shutdown(wait=True)


def write_atomic(path: str, pieces: list[tuple[Entry, int]], metadata: dict[str, str], framework: str,
                 engine: str | None = None) -> None:
    """Writes entries (each with the address of its bytes) and metadata to `path`, atomically."""
    entries = [e for e, _ in pieces]
    data_size = entries[-1].end if entries else 0
    nchunks = -(-data_size // CHUNK)
    meta = dict(metadata)
    meta.update({"dsaio.format": "1", "dsaio.framework": framework, "dsaio.chunk": str(CHUNK),
                 "dsaio.index_crc32": index_crc(entries), "dsaio.crc32": "0" * (8 * nchunks)})
    start = len(encode_header(entries, meta))  # fixed-width checksums: the final header is as long
    tmp = _temp_name(path)
    f = open_file(tmp, is_read=False, operation="save")
    try:
        _preallocate(f, start + data_size)
        with writing(f, start + data_size) as state:
            stream = _Stream(f, start, engine, state)
            try:
                for entry, addr in pieces:
                    stream.add(addr, entry.end - entry.begin)
            finally:
                stream.close()
            meta["dsaio.crc32"] = "".join(stream.crcs)
            header = encode_header(entries, meta)
            assert len(header) == start
            staged = aligned_empty(len(header), max(f.align.memory, 4096))
            staged[:] = memoryview(header)
            move(stream.engine, f, staged.ctypes.data, len(header), 0, False, TUNING, "save", None, state)
        os.fsync(f.fd)
    except BaseException:
        f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    f.close()
    try:
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(exc, path) from None
    _fsync_dir(path)


def _preallocate(f: OpenFile, size: int) -> None:
    """Reserves the blocks up front: a full disk fails here, before any data is written."""
    try:
        os.posix_fallocate(f.fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            from ..errors import AioError

            raise AioError(exc.errno, f.path, "save", f"{os.strerror(exc.errno)} reserving {size} bytes") from None
        # other errors (EOPNOTSUPP, EINVAL): this file system cannot preallocate; it is only a hint


def _named(exc: OSError, path: str) -> OSError:
    from ..errors import AioError

    return AioError(exc.errno or errno.EIO, path, "save")
