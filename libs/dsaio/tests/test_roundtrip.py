"""Byte-exact round trips through every engine, for the sizes, offsets and buffers the issue lists."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dsaio


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8)


def unaligned_empty(n: int) -> np.ndarray:
    """A writable buffer whose address is odd, so it is never aligned for O_DIRECT."""
    raw = np.zeros(n + 64, dtype=np.uint8)
    skip = (1 - raw.ctypes.data) % 64
    return raw[skip : skip + n]

SIZES = [0, 1, 511, 512, 4095, 4096, (1 << 20) + 3]
OFFSETS = [0, 4096, 3]
BIG = 64 << 20


def _aligned_copy(src: np.ndarray) -> np.ndarray:
    out = np.empty(len(src) + 4096, dtype=np.uint8)
    skip = (-out.ctypes.data) % 4096
    out = out[skip : skip + len(src)]
    out[:] = src
    return out


def _roundtrip(h, path, src, offset, aligned_buffers, asynchronous):
    if path.exists():
        path.unlink()
    buf = _aligned_copy(src) if aligned_buffers else unaligned_empty(len(src))
    buf[:] = src
    if asynchronous:
        assert h.async_pwrite(buf, str(path), offset) == 0
        assert h.wait() == 1
    else:
        h.sync_pwrite(buf, str(path), offset)
    assert os.path.getsize(path) == (offset + len(src) if len(src) else 0)
    with open(path, "rb") as f:
        f.seek(offset)
        assert f.read() == src.tobytes()
    dst = _aligned_copy(np.zeros(len(src), np.uint8)) if aligned_buffers else unaligned_empty(len(src))
    if asynchronous:
        h.async_pread(dst, str(path), offset)
        assert h.wait() == 1
    else:
        h.sync_pread(dst, str(path), offset)
    assert np.array_equal(dst, src)


@pytest.mark.parametrize("parallelism", [1, 4])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_sizes_offsets_buffers(engine, parallelism, asynchronous, tmp_path):
    h = dsaio.aio_handle(intra_op_parallelism=parallelism, engine=engine)
    for n in SIZES:
        src = random_bytes(n)
        for offset in OFFSETS:
            for aligned in (True, False):
                _roundtrip(h, tmp_path / "f.bin", src, offset, aligned, asynchronous)
    # 64 MiB once aligned and once with everything misaligned, to keep the suite quick.
    big = random_bytes(BIG)
    _roundtrip(h, tmp_path / "big.bin", big, 0, True, asynchronous)
    _roundtrip(h, tmp_path / "big.bin", big, 3, False, asynchronous)


@pytest.mark.parametrize("single_submit", [False, True])
@pytest.mark.parametrize("overlap_events", [False, True])
def test_submit_and_overlap_modes(engine, single_submit, overlap_events, tmp_path):
    h = dsaio.aio_handle(block_size=4096, queue_depth=4, single_submit=single_submit,
                         overlap_events=overlap_events, engine=engine)
    src = random_bytes(300_001)
    h.sync_pwrite(src, tmp_path / "f.bin")
    dst = np.empty_like(src)
    h.sync_pread(dst, tmp_path / "f.bin")
    assert np.array_equal(dst, src)


def test_write_keeps_bytes_around_the_range(engine, tmp_path):
    # Unaligned writes read back and merge their edge blocks: nothing outside the range changes.
    path = tmp_path / "f.bin"
    base = random_bytes(20_000, seed=1)
    path.write_bytes(base.tobytes())
    patch = random_bytes(1_001, seed=2)
    dsaio.aio_handle(engine=engine).sync_pwrite(patch, str(path), 777)
    expected = base.copy()
    expected[777 : 777 + 1001] = patch
    assert path.read_bytes() == expected.tobytes()


def test_read_write_and_pread_pwrite_variants(tmp_path):
    h = dsaio.aio_handle()
    src = random_bytes(10_000)
    path = str(tmp_path / "f.bin")
    assert h.write(src, path, True) == 1  # validate=True compares the file with the buffer
    dst = np.empty_like(src)
    assert h.read(dst, path, True) == 1
    assert np.array_equal(dst, src)
    assert h.pwrite(src, path, False, True, 100) == 0  # async
    assert h.wait() == 1
    assert h.pread(dst, path, **{"async": False, "file_offset": 100}) == 1  # DeepSpeed's spelling
    assert np.array_equal(dst, src)


def test_fd_overload_and_buffer_types(tmp_path):
    h = dsaio.aio_handle()
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        h.async_pwrite(bytearray(b"hello world"), f.fileno())
        h.wait()
    assert path.read_bytes() == b"hello world"
    h.sync_pwrite(b"HELLO", str(path))  # read-only buffers are fine to write from
    out = bytearray(11)
    h.sync_pread(memoryview(out), str(path))
    assert out == b"HELLO world"
    descriptor = os.open(path, os.O_WRONLY)
    try:  # the descriptor by DeepSpeed's keyword
        h.async_pwrite(buffer=bytearray(b"J"), fd=descriptor, file_offset=6)
        h.wait()
    finally:
        os.close(descriptor)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        h.sync_pread(memoryview(out), fd=descriptor)
    finally:
        os.close(descriptor)
    assert out == b"HELLO Jorld"
    with pytest.raises(TypeError, match="exactly one"):
        h.async_pwrite(bytearray(b"x"), str(path), fd=3)
    with pytest.raises(TypeError, match="exactly one"):
        h.sync_pread(memoryview(out))


def test_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    h = dsaio.aio_handle(intra_op_parallelism=2)
    t = torch.randn(12345, dtype=torch.float32)
    h.sync_pwrite(t, str(tmp_path / "t.bin"))
    back = torch.empty_like(t)
    h.sync_pread(back, str(tmp_path / "t.bin"))
    assert torch.equal(back, t)
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(torch.randn(4, 4).t(), str(tmp_path / "t.bin"))
