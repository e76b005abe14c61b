"""Reading a checkpoint file: check the header against the file, then one direct read of the data
into one buffer, checksummed chunk by chunk while the next chunk is read."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._buffers import fresh_empty
from .._files import OpenFile, open_file
from .._transfer import move
from ..engines import get_engine
from .checksum import crc32_at
from .format import CheckpointError, Entry
from .header import decode_header, header_length
from .stream import TUNING


def _read(f: OpenFile, engine, nbytes: int, offset: int) -> bytes:
    buf = np.empty(nbytes, dtype=np.uint8)
    move(engine, f, buf.ctypes.data, nbytes, offset, True, TUNING, "load")
    return buf.tobytes()


def read_file(path: str | os.PathLike, verify: bool = True, engine: str | None = None
              ) -> tuple[list[Entry], dict[str, str], np.ndarray]:
    """(entries, metadata, data) where data is one uint8 array holding every tensor's bytes."""
    path = os.fspath(path)
    eng = get_engine(engine)
    f = open_file(path, is_read=True, operation="load")
    try:
        size = f.size_at_open
        n = header_length(_read(f, eng, min(8, size), 0), path, size)
        start = 8 + n
        data_size = size - start
        header = decode_header(_read(f, eng, n, 8), path, data_size, verify)
        # Place the buffer so its address lines up with the file offset: then even a file whose
        # data does not start on an alignment boundary (another writer's) is read directly.
        a = max(f.align.memory, f.align.offset, 64)
        raw = fresh_empty(data_size + a, a)
        skip = start % a
        data = raw[skip : skip + data_size]
        crcs = header.crcs
        chunk = header.chunk if crcs is not None else max(data_size, 1)
        with ThreadPoolExecutor(1, thread_name_prefix="dsaio-load") as pool:
            # Reads run one after another on the worker; checksums run here as each one lands.
            futures = [pool.submit(move, eng, f, data.ctypes.data + lo, min(chunk, data_size - lo), start + lo,
                                   True, TUNING, "load") for lo in range(0, data_size, chunk)]
            for i, fut in enumerate(futures):
                fut.result()
                if crcs is not None:
                    lo = i * chunk
                    got = f"{crc32_at(data.ctypes.data + lo, min(chunk, data_size - lo)):08x}"
                    if got != crcs[i]:
                        for later in futures[i + 1 :]:
                            later.cancel()
                        raise CheckpointError(path, f"corrupted: checksum mismatch in bytes {start + lo}.."
                                                    f"{start + min(lo + chunk, data_size)} (chunk {i})")
    finally:
        f.close()
    return header.entries, header.metadata, data
