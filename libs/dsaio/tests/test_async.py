"""Many requests in flight, then one wait()."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import dsaio


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8)


def test_many_requests_then_one_wait(engine, tmp_path):
    h = dsaio.aio_handle(intra_op_parallelism=4, engine=engine)
    sources = [random_bytes(100_000 + i, seed=i) for i in range(24)]
    for i, src in enumerate(sources):
        assert h.async_pwrite(src, str(tmp_path / f"f{i}.bin")) == 0
    assert h.wait() == 24
    backs = [np.empty_like(s) for s in sources]
    for i, back in enumerate(backs):
        h.async_pread(back, str(tmp_path / f"f{i}.bin"))
    assert h.wait() == 24
    for src, back in zip(sources, backs):
        assert np.array_equal(src, back)
    assert h.wait() == 0


def test_adjacent_unaligned_async_writes_to_one_file(engine, tmp_path):
    # Neighbouring requests share edge blocks; each must keep the other's bytes.
    h = dsaio.aio_handle(intra_op_parallelism=3, engine=engine)
    path = str(tmp_path / "one.bin")
    sizes = [1, 700, 511, 513, 4095, 5000, 3, 9000, 100, 1]
    whole = random_bytes(sum(sizes), seed=7)
    offset = 0
    for n in sizes:
        h.async_pwrite(whole[offset : offset + n], path, offset)
        offset += n
    assert h.wait() == len(sizes)
    with open(path, "rb") as f:
        assert f.read() == whole.tobytes()


def test_async_error_surfaces_on_wait_and_others_complete(tmp_path):
    h = dsaio.aio_handle()
    good = random_bytes(5000)
    h.async_pwrite(good, str(tmp_path / "good.bin"))
    h.async_pread(np.empty(10, np.uint8), str(tmp_path / "missing.bin"))
    with pytest.raises(dsaio.AioError) as info:
        h.wait()
    assert info.value.errno == errno.ENOENT
    assert "missing.bin" in str(info.value)
    assert (tmp_path / "good.bin").read_bytes() == good.tobytes()
    assert h.wait() == 0  # the failure was reported once


def test_handle_defaults_and_getters():
    h = dsaio.aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism()) == (1048576, 8, False, True, 1)
    with pytest.raises(ValueError, match="queue_depth"):
        dsaio.aio_handle(queue_depth=0)
