"""The alignment O_DIRECT needs, asked of the file system rather than assumed.

statx(STATX_DIOALIGN) (Linux 6.1+) reports the memory and file-offset alignment for direct I/O,
or that the file system has none. Older kernels get the file system block size, which is always
a safe (if larger than needed) alignment. Memory file systems are treated as having no direct I/O:
tmpfs accepts O_DIRECT since Linux 6.6, but there it is the same memory copy as a buffered write,
only with 4096-byte alignment, which would send every tensor torch allocates through a bounce buffer.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

_STATX_DIOALIGN = 0x2000
_AT_EMPTY_PATH = 0x1000
_SYS_STATX = {"x86_64": 332, "aarch64": 291, "ppc64le": 383, "s390x": 379, "riscv64": 291}
# struct statx offsets (linux/stat.h): stx_mask at 0, stx_dev_major/minor at 0x88/0x8c,
# stx_dio_mem_align / stx_dio_offset_align at 0x98 / 0x9c; the struct is 0x100 bytes.
_STATX_SIZE = 0x100
_MEMORY_FILE_SYSTEMS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}  # statfs f_type (linux/magic.h)


@dataclass(frozen=True)
class Alignment:
    memory: int  # buffer addresses must be multiples of this
    offset: int  # file offsets and lengths must be multiples of this
    direct: bool  # whether O_DIRECT is available at all on this file system
    source: str  # how we learned it, for backends() and error messages


def _statx_dio(fd: int) -> tuple[int, int, int] | None:
    nr = _SYS_STATX.get(platform.machine())
    if nr is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    rc = libc.syscall(nr, fd, b"", _AT_EMPTY_PATH, _STATX_DIOALIGN, buf)
    if rc != 0:
        return None
    raw = buf.raw
    mask = int.from_bytes(raw[0:4], "little")
    if not mask & _STATX_DIOALIGN:
        return None
    return int.from_bytes(raw[0x98:0x9C], "little"), int.from_bytes(raw[0x9C:0xA0], "little"), mask


def _fs_type(fd: int) -> int | None:
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux; f_type comes first
    if ctypes.CDLL(None, use_errno=True).fstatfs(fd, buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


def _compute(fd: int) -> Alignment:
    memory_fs = _MEMORY_FILE_SYSTEMS.get(_fs_type(fd))
    if memory_fs is not None:
        return Alignment(1, 1, False, f"{memory_fs}: direct I/O would only add alignment to a memory copy")
    found = _statx_dio(fd)
    if found is not None:
        mem, off, _ = found
        if off == 0:
            return Alignment(1, 1, False, "statx: no direct I/O on this file system")
        return Alignment(mem, off, True, f"statx STATX_DIOALIGN: memory {mem}, offset {off}")
    block = os.fstatvfs(fd).f_bsize
    return Alignment(block, block, True, f"file system block size {block} (statx gave no DIO alignment)")


_cache: dict[int, Alignment] = {}


def alignment_of_fd(fd: int) -> Alignment:
    """The direct-I/O alignment of an open regular file, cached per device (one answer per fs).

    Ask with a regular file: statx reports DIO alignment for files, not directories.
    """
    dev = os.fstat(fd).st_dev
    found = _cache.get(dev)
    if found is None:
        found = _cache[dev] = _compute(fd)
    return found
