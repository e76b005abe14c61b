"""Reserving a file's blocks before a write that creates or extends it.

ext4 and XFS serialise direct writes past the end of a file (each one changes its size under the
inode lock) and allocate blocks as they go: queued writes into a new file ran at a fifth of the
disk's speed. Once the final size is reserved they are writes into allocated blocks, which run in
parallel; and a full disk fails here, before any byte is written, not halfway through.

fallocate(2) where the file system has it. Where it is refused: posix_fallocate (glibc then writes a
byte into every block, which works only through a buffered descriptor), and last ftruncate, which sets
the size without reserving anything, so the free space is checked first. Each fallback is logged once.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os

from .errors import AioError

log = logging.getLogger("dsaio")

_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _fallocate.restype = ctypes.c_int

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # this file system (or descriptor) cannot do it
_logged: set[str] = set()


def _log_once(method: str, why: str, path: str) -> None:
    if method not in _logged:
        _logged.add(method)
        log.warning("dsaio: %s; files are preallocated with %s from now on where fallocate is refused "
                    "(first seen on %s)", why, method, path)


def _fallocate_errno(fd: int, offset: int, length: int) -> int:
    if _fallocate is None:
        return errno.ENOSYS
    while True:
        if _fallocate(fd, 0, offset, length) == 0:
            return 0
        err = ctypes.get_errno()
        if err != errno.EINTR:
            return err


def _full(err: int, path: str, operation: str, offset: int, length: int, fd: int) -> AioError:
    try:
        st = os.fstatvfs(fd)
        free = f"; {st.f_bavail * st.f_frsize} bytes free there"
    except OSError:
        free = ""
    return AioError(err, path, operation, f"{os.strerror(err)} reserving {length} bytes at offset {offset} "
                                          f"before writing{free}")


def reserve(fd: int, offset: int, length: int, path: str, operation: str) -> None:
    """Makes the file at least `offset + length` bytes long with that range's blocks reserved.

    Raises AioError (ENOSPC, EDQUOT or EFBIG) when the file system cannot hold it; the caller
    restores the file (see _files.writing), since a failed attempt may have extended it partly.
    """
    if length <= 0:
        return
    err = _fallocate_errno(fd, offset, length)
    if err == 0:
        return
    if err in FULL:
        raise _full(err, path, operation, offset, length, fd)
    if err not in _REFUSED:
        raise AioError(err, path, operation, f"{os.strerror(err)} reserving {length} bytes at offset {offset}")
    refused = f"fallocate is refused on the file system of {path} ({errno.errorcode.get(err, err)})"
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno in FULL:
            raise _full(exc.errno, path, operation, offset, length, fd) from None
        if exc.errno not in _REFUSED:
            raise AioError(exc.errno or errno.EIO, path, operation,
                           f"{os.strerror(exc.errno or errno.EIO)} reserving {length} bytes at offset {offset}") from None
    else:
        _log_once("posix_fallocate", refused, path)
        return
    # Nothing can reserve blocks here: size the file (so writes into it are not extending writes)
    # after checking that the free space would hold it.
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < length:
        raise _full(errno.ENOSPC, path, operation, offset, length, fd)
    if os.fstat(fd).st_size < offset + length:
        os.ftruncate(fd, offset + length)
    _log_once("ftruncate", refused + " and posix_fallocate cannot write through O_DIRECT; "
              "free space is checked, not reserved", path)
