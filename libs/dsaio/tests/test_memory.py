"""Page-locked buffers and the GPU-only handle on a machine without a GPU."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import dsaio


def test_cpu_locked_numpy_buffer_is_aligned_and_usable(tmp_path):
    h = dsaio.aio_handle()
    buf = h.new_cpu_locked_tensor(10_000, np.empty(0, np.float32))
    assert buf.dtype == np.float32 and buf.shape == (10_000,) and buf.ctypes.data % 4096 == 0
    buf[:] = np.arange(10_000)
    h.sync_pwrite(buf, str(tmp_path / "f.bin"))
    back = h.new_cpu_locked_tensor(10_000, buf)
    h.sync_pread(back, str(tmp_path / "f.bin"))
    assert np.array_equal(back, buf)
    assert h.free_cpu_locked_tensor(buf) and h.free_cpu_locked_tensor(back)
    assert not h.free_cpu_locked_tensor(np.ones(3))


def test_cpu_locked_torch_tensor():
    torch = pytest.importorskip("torch")
    h = dsaio.aio_handle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.numel() == 1000 and t.data_ptr() % 4096 == 0
    t.fill_(1.5)
    from dsaio.locked import is_locked

    locked = is_locked(t)  # False only where RLIMIT_MEMLOCK refused the mlock (a warning said so)
    assert h.is_pinned(t) is locked and h.is_pinned(t.narrow(0, 500, 10)) is locked  # views of it too
    assert not h.is_pinned(torch.empty(1000, dtype=torch.bfloat16))
    assert h.free_cpu_locked_tensor(t)
    assert not h.is_pinned(t)  # unlocked once freed


def test_gds_handle_names_what_is_missing():
    with pytest.raises(dsaio.AioError) as info:
        dsaio.gds_handle()
    assert info.value.errno == errno.ENODEV
    assert "GPUDirect Storage" in str(info.value) and "nvidia-fs" in str(info.value)
