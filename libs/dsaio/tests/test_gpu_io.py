"""On a CUDA GPU: aio_handle reads and writes pinned host tensors and CUDA tensors, on every engine, sync
and async, aligned and ragged; new_cpu_locked_tensor gives torch's pinned memory and takes it back; and
gds_handle round-trips CUDA tensors where GPUDirect Storage is there (skipped naming what is missing).

The files are checked against the bytes written (read back with plain numpy), so a staged copy that went
to the wrong place or not at all shows. Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1
(tools/gpu_check/run.sh --dry-run) runs the same round trips with CPU tensors standing in (mlock-ed ones
for pinned memory).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dsaio

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

SIZES = {"aligned 4 MiB": 4 << 20, "ragged 1 MiB + 3": (1 << 20) + 3}


def pattern(nbytes: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8))


def pinned(handle: dsaio.aio_handle, nbytes: int) -> torch.Tensor:
    buffer = handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
    if CUDA:
        assert buffer.is_pinned()
    return buffer


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_pinned_host_tensors_round_trip(engine, size, asynchronous, tmp_path):
    nbytes, path = SIZES[size], str(tmp_path / "pinned.bin")
    with dsaio.aio_handle(engine=engine, intra_op_parallelism=2) as handle:
        source, back = pinned(handle, nbytes), pinned(handle, nbytes)
        source.copy_(pattern(nbytes, 1))
        back.zero_()
        if asynchronous:
            handle.async_pwrite(source, path)
            assert handle.wait() == 1
            handle.async_pread(back, path)
            assert handle.wait() == 1
        else:
            handle.sync_pwrite(source, path)
            handle.sync_pread(back, path)
        assert np.array_equal(np.fromfile(path, dtype=np.uint8), source.numpy())
        assert torch.equal(back, source)
        assert handle.free_cpu_locked_tensor(source) and handle.free_cpu_locked_tensor(back)


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_device_tensors_round_trip(engine, size, asynchronous, tmp_path):
    nbytes, path = SIZES[size], str(tmp_path / "device.bin")
    expected = pattern(nbytes, 2)
    source = expected.to(DEVICE).view(torch.uint8)
    back = torch.full((nbytes,), 7, dtype=torch.uint8, device=DEVICE)
    with dsaio.aio_handle(engine=engine) as handle:
        if asynchronous:
            handle.async_pwrite(source, path)
            handle.wait()
            handle.async_pread(back, path)
            handle.wait()
        else:
            handle.sync_pwrite(source, path)
            handle.sync_pread(back, path)
    assert back.device.type == DEVICE.type
    assert np.array_equal(np.fromfile(path, dtype=np.uint8), expected.numpy())
    assert torch.equal(back.cpu(), expected)


def test_device_tensor_of_another_dtype_at_an_offset(tmp_path):
    """A bf16 CUDA tensor written at a file offset and read back into a slice of a larger CUDA tensor."""
    path = str(tmp_path / "offset.bin")
    values = torch.randn(3000, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with dsaio.aio_handle() as handle:
        handle.sync_pwrite(torch.zeros(100, dtype=torch.uint8), path)  # the file's first 100 bytes
        handle.sync_pwrite(values.to(DEVICE), path, file_offset=100)
        target = torch.zeros(4000, dtype=torch.bfloat16, device=DEVICE)
        handle.sync_pread(target[500:3500], path, file_offset=100)
    assert torch.equal(target[500:3500].cpu(), values)
    assert not target[:500].any() and not target[3500:].any()


def test_gds_handle_round_trips_device_tensors_where_gds_is_there(tmp_path):
    from dsaio.gds import gds_missing

    missing = gds_missing()
    if missing:
        pytest.skip("GPUDirect Storage is not available here: missing " + "; ".join(missing))
    path = str(tmp_path / "gds.bin")
    values = torch.arange(1 << 20, dtype=torch.float32, device=DEVICE)
    with dsaio.gds_handle() as handle:
        buffer = handle.new_pinned_device_tensor(values.numel(), values)
        buffer.copy_(values)
        handle.sync_pwrite(buffer, path)
        back = torch.zeros_like(values)
        assert handle.pin_device_tensor(back)
        handle.sync_pread(back, path)
        assert handle.unpin_device_tensor(back) and handle.free_pinned_device_tensor(buffer)
    assert torch.equal(back, values)
