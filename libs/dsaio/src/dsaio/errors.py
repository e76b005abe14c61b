"""dsaio's one error class: an OSError that also names the operation and the file."""

from __future__ import annotations

import errno as _errno
import os


class AioError(OSError):
    """An I/O request failed. `errno`, `filename` and `operation` say which and where.

    Raised directly by synchronous calls and by `wait()` for asynchronous ones.
    """

    def __init__(self, err: int, filename: str | os.PathLike | None, operation: str, detail: str = ""):
        reason = detail or os.strerror(err)
        super().__init__(err, f"{operation} failed: {reason}", None if filename is None else os.fspath(filename))
        self.operation = operation

    def __str__(self) -> str:
        where = f" on {self.filename!r}" if self.filename is not None else ""
        return f"[Errno {self.errno}] {self.strerror}{where}"


def short_read(filename: str, operation: str, wanted: int, offset: int, file_size: int) -> AioError:
    return AioError(
        _errno.EIO,
        filename,
        operation,
        f"file is shorter than the buffer: {wanted} bytes wanted at offset {offset}, "
        f"only {max(0, file_size - offset)} there (file size {file_size})",
    )
