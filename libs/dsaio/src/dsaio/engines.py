"""The I/O engines, which of them work on this machine, and which one a handle uses.

Native (compiled at install from csrc/): `io_uring`, `aio` (Linux native AIO) and `threads`
(pread/pwrite workers, for containers whose seccomp filter refuses the other two). `python` is
the same idea as `threads` in pure Python; it serves when the native core could not be built.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("dsaio")

# Fastest first, as measured on this project's machines (see BENCHMARKS.md).
PREFERENCE = ("aio", "io_uring", "threads", "python")
ENV_ENGINE = "DSAIO_ENGINE"  # force one engine, e.g. for tests or to compare


@dataclass(frozen=True)
class Tuning:
    block_size: int
    queue_depth: int
    single_submit: bool
    overlap_events: bool


class Engine(Protocol):
    name: str

    def transfer(self, fd: int, addr: int, nbytes: int, offset: int, is_read: bool, tuning: Tuning) -> int:
        """Move an aligned range: bytes moved from its start (short only at end of file) or -errno."""
        ...


class NativeEngine:
    def __init__(self, name: str, native) -> None:
        self.name = name
        self._transfer = native.transfer

    def transfer(self, fd: int, addr: int, nbytes: int, offset: int, is_read: bool, tuning: Tuning) -> int:
        return self._transfer(self.name, fd, addr, nbytes, offset, is_read, tuning.block_size,
                              tuning.queue_depth, tuning.single_submit, tuning.overlap_events)


class PythonEngine:
    """pread/pwrite from Python (os.preadv and os.pwrite release the GIL)."""

    name = "python"

    def transfer(self, fd: int, addr: int, nbytes: int, offset: int, is_read: bool, tuning: Tuning) -> int:
        if nbytes == 0:
            return 0
        view = memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")
        block = max(tuning.block_size, 1)
        done = 0
        while done < nbytes:
            chunk = view[done : done + block]
            try:
                n = os.preadv(fd, [chunk], offset + done) if is_read else os.pwrite(fd, chunk, offset + done)
            except OSError as exc:
                return -(exc.errno or errno.EIO)
            if n == 0:
                break  # end of file
            done += n
        return done


def _load_native():
    if os.environ.get("DSAIO_NO_NATIVE") == "1":  # to exercise the fallback; also a way out of a bad build
        return None, "the native core is disabled by DSAIO_NO_NATIVE=1"
    try:
        from . import _native
    except ImportError as exc:
        return None, f"the native core was not built or does not load ({exc})"
    return _native, ""


_native, _native_problem = _load_native()
_warned = False


def _warn_fallback_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"dsaio: {_native_problem}; using the pure-Python engine, which is slower. "
                      "Reinstall with a C++17 compiler and Linux kernel headers to build it.",
                      RuntimeWarning, stacklevel=3)


_probed: dict[str, tuple[bool, str]] = {}  # a probe sets up a kernel queue (tens of ms): once per process


def backends() -> dict[str, dict[str, object]]:
    """Which engines work here: {name: {"available": bool, "reason": str}}, fastest first."""
    found: dict[str, dict[str, object]] = {}
    for name in PREFERENCE:
        if name == "python":
            found[name] = {"available": True, "reason": "always available (pure Python pread/pwrite)"}
        elif _native is None:
            found[name] = {"available": False, "reason": _native_problem}
        else:
            if name not in _probed:
                _probed[name] = _native.probe(name)
            ok, why = _probed[name]
            found[name] = {"available": bool(ok), "reason": "system calls work here" if ok else why}
    return found


_engines: dict[str, Engine] = {}


def get_engine(name: str | None = None) -> Engine:
    """The engine called `name`, or the fastest one that works here (overridable by $DSAIO_ENGINE)."""
    name = name or os.environ.get(ENV_ENGINE) or None
    if name in _engines:
        return _engines[name]
    table = backends()
    if name is None:
        name = next(n for n in PREFERENCE if table[n]["available"])
        if name == "python" and _native is None:
            _warn_fallback_once()
    elif name not in table:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(PREFERENCE)}")
    elif not table[name]["available"]:
        raise RuntimeError(f"engine {name!r} does not work here: {table[name]['reason']}")
    engine: Engine = PythonEngine() if name == "python" else NativeEngine(name, _native)
    _engines[name] = engine
    log.debug("dsaio engine: %s", name)
    return engine
