"""`aio_handle`: DeepSpeed's DeepNVMe handle, on dsaio's engines."""

from __future__ import annotations

import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._align import alignment_of_fd
from ._buffers import as_raw
from ._files import open_file
from ._ops import Op
from .engines import Engine, Tuning, get_engine
from .errors import AioError, short_read
from .limits import queue_limits
from .locked import free_cpu_locked_tensor as _free_locked
from .locked import is_pinned as _is_pinned
from .locked import new_cpu_locked_tensor as _new_locked


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"aio_handle: {name} must be a positive integer, got {value!r}")
    return value


class aio_handle:  # DeepSpeed's name, lower case
    """Reads and writes tensors and buffers to files with O_DIRECT at the speed of the disk.

    Defaults are the config reference's `aio` section (queue_depth 8, overlap_events true).
    `engine` picks one of `dsaio.backends()` by name; by default the fastest that works here.
    """

    def __init__(self, block_size: int = 1048576, queue_depth: int = 8, single_submit: bool = False,
                 overlap_events: bool = True, intra_op_parallelism: int = 1, engine: str | None = None) -> None:
        self._tuning = Tuning(_positive("block_size", block_size), _positive("queue_depth", queue_depth),
                              bool(single_submit), bool(overlap_events))
        self._parallelism = _positive("intra_op_parallelism", intra_op_parallelism)
        self._engine: Engine = get_engine(engine)
        limits = queue_limits(self._engine.name)
        if limits.queue_depth is not None and queue_depth > limits.queue_depth:
            raise ValueError(f"aio_handle: queue_depth {queue_depth} is deeper than the {self._engine.name} engine's "
                             f"kernel queues may be here (at most {limits.queue_depth}: {limits.source}); 8 to 128 "
                             f"are typical")
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Op] = []
        self._lock = threading.Lock()

    # -- configuration -------------------------------------------------------------------------
    def get_block_size(self) -> int:
        return self._tuning.block_size

    def get_queue_depth(self) -> int:
        return self._tuning.queue_depth

    def get_single_submit(self) -> bool:
        return self._tuning.single_submit

    def get_overlap_events(self) -> bool:
        return self._tuning.overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._parallelism

    def get_thread_count(self) -> int:  # the config reference's name for intra_op_parallelism
        return self._parallelism

    def get_engine(self) -> str:
        return self._engine.name

    def get_alignment(self, path: str | os.PathLike = ".") -> int:
        """The O_DIRECT offset alignment of the file system holding `path` (a file or a directory)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            with tempfile.TemporaryFile(dir=path) as probe:
                return alignment_of_fd(probe.fileno()).offset
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return alignment_of_fd(fd).offset
        finally:
            os.close(fd)

    # -- requests ------------------------------------------------------------------------------
    def _start(self, buffer: Any, filename: Any, file_offset: int, is_read: bool, parallel: bool,
               asynchronous: bool, validate: bool, operation: str) -> int:
        if isinstance(file_offset, bool) or not isinstance(file_offset, int) or file_offset < 0:
            raise ValueError(f"{operation}: file_offset must be a non-negative integer, got {file_offset!r}")
        raw = as_raw(buffer, for_read=is_read, what=operation)
        try:
            op = self._open(raw, filename, file_offset, is_read, parallel, validate, operation)
        except AioError as exc:
            if not asynchronous:
                raise
            op = exc  # an asynchronous request reports its failure on wait(), like any other
        if isinstance(op, BaseException):
            with self._lock:
                self._pending.append(_Failed(op))
            return 0
        # A blocking request runs its first part on the calling thread instead of idling.
        first = 0 if asynchronous else 1
        if len(op.parts) > first:
            pool = self._workers()
            for i in range(first, len(op.parts)):
                pool.submit(op.run_part, i)
        if not asynchronous:
            op.run_part(0)
        if asynchronous:
            with self._lock:
                self._pending.append(op)
            return 0
        op.done.wait()
        if op.error is not None:
            raise op.error
        return 1

    def _open(self, raw, filename, file_offset, is_read, parallel, validate, operation) -> Op:
        f = open_file(filename, is_read, operation)
        try:
            if is_read and raw.nbytes and f.size_at_open < file_offset + raw.nbytes:
                raise short_read(f.path, operation, raw.nbytes, file_offset, f.size_at_open)
            return Op(self._engine, f, raw, file_offset, is_read, self._tuning, operation,
                      self._parallelism if parallel else 1, validate)
        except BaseException:
            f.close()
            raise

    def _workers(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._parallelism, thread_name_prefix="dsaio")
            return self._pool

    def wait(self) -> int:
        """Blocks until every asynchronous request completed; returns how many did.

        Raises the first error of any of them (the others still completed or failed fully).
        """
        with self._lock:
            ops, self._pending = self._pending, []
        for op in ops:
            op.done.wait()
        for op in ops:
            if op.error is not None:
                raise op.error
        return len(ops)

    # `filename` may also be an open file descriptor, given in its place or by name as `fd=` (DeepSpeed's overload).
    def sync_pread(self, buffer: Any, filename: Any = None, file_offset: int = 0, *, fd: int | None = None) -> int:
        target = _file_or_fd(filename, fd, "sync_pread")
        return self._start(buffer, target, file_offset, True, True, False, False, "sync_pread")

    def sync_pwrite(self, buffer: Any, filename: Any = None, file_offset: int = 0, *, fd: int | None = None) -> int:
        target = _file_or_fd(filename, fd, "sync_pwrite")
        return self._start(buffer, target, file_offset, False, True, False, False, "sync_pwrite")

    def async_pread(self, buffer: Any, filename: Any = None, file_offset: int = 0, *, fd: int | None = None) -> int:
        target = _file_or_fd(filename, fd, "async_pread")
        return self._start(buffer, target, file_offset, True, True, True, False, "async_pread")

    def async_pwrite(self, buffer: Any, filename: Any = None, file_offset: int = 0, *, fd: int | None = None) -> int:
        target = _file_or_fd(filename, fd, "async_pwrite")
        return self._start(buffer, target, file_offset, False, True, True, False, "async_pwrite")

    def pread(self, buffer: Any, filename: Any, validate: bool = False, async_op: bool = False,
              file_offset: int = 0, **kwargs: Any) -> int:
        """DeepSpeed spells `async_op` as `async`; pass it as `**{"async": True}` if you must."""
        asynchronous = bool(kwargs.pop("async", async_op))
        _no_more(kwargs, "pread")
        return self._start(buffer, filename, file_offset, True, True, asynchronous, validate, "pread")

    def pwrite(self, buffer: Any, filename: Any, validate: bool = False, async_op: bool = False,
               file_offset: int = 0, **kwargs: Any) -> int:
        asynchronous = bool(kwargs.pop("async", async_op))
        _no_more(kwargs, "pwrite")
        return self._start(buffer, filename, file_offset, False, True, asynchronous, validate, "pwrite")

    def read(self, buffer: Any, filename: Any, validate: bool = False, file_offset: int = 0) -> int:
        """Blocking and not split across threads."""
        return self._start(buffer, filename, file_offset, True, False, False, validate, "read")

    def write(self, buffer: Any, filename: Any, validate: bool = False, file_offset: int = 0) -> int:
        return self._start(buffer, filename, file_offset, False, False, False, validate, "write")

    # -- page-locked host memory ----------------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any) -> Any:
        return _new_locked(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        return _free_locked(tensor)

    def is_pinned(self, tensor: Any) -> bool:
        """Whether `tensor` is (a view of) page-locked memory from new_cpu_locked_tensor, or torch's pinned memory."""
        return _is_pinned(tensor)

    def close(self) -> None:
        """Waits for what is in flight and stops the worker threads."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> aio_handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        t = self._tuning
        return (f"aio_handle(block_size={t.block_size}, queue_depth={t.queue_depth}, "
                f"single_submit={t.single_submit}, overlap_events={t.overlap_events}, "
                f"intra_op_parallelism={self._parallelism}, engine={self._engine.name!r})")


class _Failed:
    """An asynchronous request that failed before it started (e.g. a missing file)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.done = threading.Event()
        self.done.set()


def _file_or_fd(filename: Any, fd: int | None, operation: str) -> Any:
    """The file an operation names: a path or descriptor as `filename`, or a descriptor as `fd` (exactly one)."""
    if (filename is None) == (fd is None):
        raise TypeError(f"{operation}() takes the file as filename (a path or an open descriptor) or as fd=, exactly "
                        f"one of them; got filename={filename!r}, fd={fd!r}")
    if fd is not None and (isinstance(fd, bool) or not isinstance(fd, int)):
        raise TypeError(f"{operation}(fd={fd!r}): fd must be an open file descriptor (an int)")
    return filename if fd is None else fd


def _no_more(kwargs: dict, operation: str) -> None:
    if kwargs:
        raise TypeError(f"{operation}() got unexpected keyword arguments: {', '.join(kwargs)}")
