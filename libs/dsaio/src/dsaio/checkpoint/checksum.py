"""CRC-32 of each chunk of a checkpoint's data region, computed from the tensors' own memory.

The checksums run on worker threads while the same bytes are being written, on another core
(both CRC functions release the GIL). Each chunk starts its CRC from zero, so chunks are
independent and two workers share them. The native CRC (PCLMULQDQ folding) is several times
faster than zlib's; zlib's serves when the native core is missing.
"""

from __future__ import annotations

import ctypes
import zlib
from concurrent.futures import ThreadPoolExecutor

from ..engines import _native  # None when the native core is missing or disabled

WORKERS = 2  # this project's machines have 2 cores; more would only contend


def crc32_at(addr: int, nbytes: int, crc: int = 0) -> int:
    """zlib.crc32 of the `nbytes` at `addr`, continuing from `crc`."""
    if _native is not None:
        return _native.crc32(addr, nbytes, crc)
    return zlib.crc32((ctypes.c_char * nbytes).from_address(addr), crc)


def _crc(parts: list[tuple[int, int]]) -> str:
    crc = 0
    for addr, nbytes in parts:
        crc = crc32_at(addr, nbytes, crc)
    return f"{crc:08x}"


def split_chunks(pieces: list[tuple[int, int]], chunk: int) -> list[list[tuple[int, int]]]:
    """(address, nbytes) pieces laid end to end, cut at every multiple of `chunk` bytes."""
    chunks: list[list[tuple[int, int]]] = []
    fill = chunk
    for addr, nbytes in pieces:
        done = 0
        while done < nbytes:
            if fill == chunk:
                chunks.append([])
                fill = 0
            n = min(nbytes - done, chunk - fill)
            chunks[-1].append((addr + done, n))
            fill += n
            done += n
    return chunks


class Checksums:
    """Starts checksumming on entry; `result()` gives the 8-hex-digit CRCs, chunk by chunk.

    Leaving the `with` block waits for every worker, so the memory they read may be freed after.
    """

    def __init__(self, pieces: list[tuple[int, int]], chunk: int) -> None:
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="dsaio-crc")
        self.futures = [self.pool.submit(_crc, parts) for parts in split_chunks(pieces, chunk)]

    def result(self) -> list[str]:
        return [f.result() for f in self.futures]

    def __enter__(self) -> Checksums:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
