"""Writing a checkpoint file atomically.

The data region streams out with O_DIRECT (see stream.py) while worker threads checksum the same
bytes (see checksum.py). The header, which holds the checksums, goes last. Then: fsync the file,
rename it over the target, fsync the directory. A crash at any point before the rename leaves
the previous file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets

from .._buffers import aligned_empty
from .._files import open_file, writing
from .._transfer import move
from ..engines import get_engine
from .checksum import Checksums
from .format import CHUNK, FORMAT, Entry, encode_header, index_crc, metadata_crc
from .stream import TUNING, DataStream


def _temp_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.dsaio-tmp-{os.getpid()}-{secrets.token_hex(4)}")


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, pieces: list[tuple[Entry, int]], metadata: dict[str, str], framework: str,
                 engine: str | None = None) -> None:
    """Writes entries (each with the address of its bytes) and metadata to `path`, atomically."""
    entries = [e for e, _ in pieces]
    data_size = entries[-1].end if entries else 0
    nchunks = -(-data_size // CHUNK)
    meta = dict(metadata)
    meta.update({"dsaio.format": FORMAT, "dsaio.framework": framework, "dsaio.chunk": str(CHUNK),
                 "dsaio.index_crc32": index_crc(entries), "dsaio.crc32": "0" * (8 * nchunks)})
    meta["dsaio.metadata_crc32"] = metadata_crc(meta)  # covers everything but the data CRCs, filled in below
    start = len(encode_header(entries, meta))  # fixed-width checksums: the final header is as long
    tmp = _temp_name(path)
    f = open_file(tmp, is_read=False, operation="save")
    try:
        runs = [(addr, e.end - e.begin) for e, addr in pieces]
        eng = get_engine(engine)
        # Registering the whole file reserves its blocks: a full disk fails here, before any write.
        with writing(f, 0, start + data_size, "save") as state, Checksums(runs, CHUNK) as sums:
            with DataStream(f, start, eng, state) as stream:
                for addr, nbytes in runs:
                    stream.write(addr, nbytes)
            meta["dsaio.crc32"] = "".join(sums.result())
            header = encode_header(entries, meta)
            assert len(header) == start
            staged = aligned_empty(len(header), max(f.align.memory, 4096))
            staged[:] = memoryview(header)
            move(eng, f, staged.ctypes.data, len(header), 0, False, TUNING, "save", None, state)
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


def _named(exc: OSError, path: str) -> OSError:
    from ..errors import AioError

    return AioError(exc.errno or errno.EIO, path, "save")
