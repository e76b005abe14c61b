"""Each failure the issue lists raises AioError with errno, path and operation; none is silent."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dsaio
from dsaio._files import open_file
from dsaio._transfer import move
from dsaio.engines import Tuning, get_engine


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8)


def test_missing_file(tmp_path):
    with pytest.raises(dsaio.AioError) as info:
        dsaio.aio_handle().sync_pread(np.empty(10, np.uint8), str(tmp_path / "nope.bin"))
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ENOENT
    assert e.filename == str(tmp_path / "nope.bin") and e.operation == "sync_pread"


def test_missing_directory(tmp_path):
    with pytest.raises(dsaio.AioError) as info:
        dsaio.aio_handle().sync_pwrite(np.ones(10, np.uint8), str(tmp_path / "no" / "dir.bin"))
    assert info.value.errno == errno.ENOENT and "no/dir.bin" in str(info.value)


def test_file_shorter_than_buffer(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 1000)
    with pytest.raises(dsaio.AioError, match=r"shorter than the buffer: 1500 bytes wanted at offset 0.*1000"):
        dsaio.aio_handle().sync_pread(np.empty(1500, np.uint8), str(path))
    with pytest.raises(dsaio.AioError, match="shorter"):
        dsaio.aio_handle().sync_pread(np.empty(10, np.uint8), str(path), 995)


def test_file_that_changed_size(engine, tmp_path):
    path = tmp_path / "shrinks.bin"
    path.write_bytes(random_bytes(100_000).tobytes())
    f = open_file(str(path), True, "sync_pread")
    try:
        os.truncate(path, 10_000)  # another process cut the file after we opened it
        buf = np.empty(100_000, np.uint8)
        with pytest.raises(dsaio.AioError, match="changed size"):
            move(get_engine(engine), f, buf.ctypes.data, buf.nbytes, 0, True, Tuning(1 << 20, 8, False, True),
                 "sync_pread")
    finally:
        f.close()


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(dsaio.AioError) as info:
        dsaio.aio_handle().sync_pread(np.empty(10, np.uint8), str(tmp_path))
    assert info.value.errno in (errno.EISDIR, errno.EINVAL)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the write as another user, which needs root")
def test_permission_denied(tmp_path):
    target = tmp_path / "locked"
    target.mkdir()
    os.chmod(target, 0o500)
    os.chmod(tmp_path, 0o755)
    code = textwrap.dedent(f"""
        import os, numpy as np, dsaio
        os.setgid(65534); os.setuid(65534)
        try:
            dsaio.aio_handle().sync_pwrite(np.ones(8, np.uint8), {str(target / "f.bin")!r})
        except dsaio.AioError as e:
            print(e.errno, e.operation, e.filename)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(errno.EACCES), "sync_pwrite", str(target / "f.bin")], out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a tiny tmpfs")
def test_disk_full(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = textwrap.dedent(f"""
        import numpy as np, dsaio
        h = dsaio.aio_handle()
        try:
            h.sync_pwrite(np.ones(4 << 20, np.uint8), {str(mnt / "f.bin")!r})
        except dsaio.AioError as e:
            print("write", e.errno, e.filename)
        try:
            dsaio.save({{"x": np.ones(4 << 20, np.uint8)}}, {str(mnt / "c.safetensors")!r})
        except dsaio.AioError as e:
            print("save", e.errno)
    """)
    # A private mount namespace: the 1 MiB file system vanishes with the child, even on a crash.
    script = f"mount -t tmpfs -o size=1m tmpfs {mnt} && exec {sys.executable} -c {_quote(code)}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    if "mount" in out.stderr and out.returncode != 0:
        pytest.skip(f"cannot mount here: {out.stderr.strip()}")
    assert out.stdout.split() == ["write", str(errno.ENOSPC), str(mnt / "f.bin"), "save", str(errno.ENOSPC)], out.stderr


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def test_bad_arguments(tmp_path):
    h = dsaio.aio_handle()
    with pytest.raises(ValueError, match="read-only"):
        h.sync_pread(b"immutable", str(tmp_path / "f"))
    with pytest.raises(TypeError, match="buffer"):
        h.sync_pwrite(12, str(tmp_path / "f"))
    with pytest.raises(ValueError, match="file_offset"):
        h.sync_pwrite(b"x", str(tmp_path / "f"), -1)
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(np.ones((4, 4))[:, 1], str(tmp_path / "f"))
    with pytest.raises(ValueError, match="unknown engine"):
        dsaio.aio_handle(engine="nvme-of")
