"""Timing one handle configuration on a path: shared by dsaio-bench and dsaio-tune."""

from __future__ import annotations

import os
import re
import statistics
import sys
import time

from .._buffers import aligned_empty
from ..handle import aio_handle

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)(i?B)?", text.strip().upper().replace("IB", "").replace("B", ""))
    if not m:
        raise ValueError(f"size {text!r}: expected a number with an optional K, M or G suffix, e.g. 1G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def drop_page_cache() -> bool:
    """Best effort (needs root); O_DIRECT bypasses the cache anyway, this is for fair neighbours."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def measure(path: str, nbytes: int, op: str, loops: int, config: dict, progress: str = "") -> list[float]:
    """GB/s of each of `loops` runs of one `op` ("read" or "write") of `nbytes` to `path`."""
    h = aio_handle(**config)
    buf = aligned_empty(nbytes, 4096)
    buf[:] = 7
    if op == "read" and (not os.path.exists(path) or os.path.getsize(path) < nbytes):
        h.sync_pwrite(buf, path)
    rates = []
    for i in range(loops):
        start = time.perf_counter()
        if op == "read":
            h.sync_pread(buf, path)
        else:
            h.sync_pwrite(buf, path)
            os.fdatasync(fd := os.open(path, os.O_RDONLY)) or os.close(fd)
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
        if progress:
            print(f"\r{progress} run {i + 1}/{loops}: {rates[-1]:.2f} GB/s   ", end="", file=sys.stderr, flush=True)
    h.close()
    return rates


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
