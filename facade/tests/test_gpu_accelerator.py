"""On a CUDA GPU: dstrain.accelerator's CUDA backend as DeepSpeed scripts use it: get_accelerator() picks
it, names devices and NCCL, runs work on its streams in order through its events, times with them, reports
memory that moves with allocations, and saves and restores the device's random state.

Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1 (tools/gpu_check/run.sh --dry-run) runs the same calls on the
CPU accelerator (host streams and events, the process's memory), so the test's own logic is exercised.
"""

import os

import pytest
import torch

from dstrain.accelerator import get_accelerator

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]


@pytest.fixture
def acc(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    return get_accelerator()


def test_get_accelerator_is_the_device_torch_sees(acc):
    if CUDA:
        assert acc.device_name() == "cuda" and acc.device_name(0) == "cuda:0"
        assert acc.communication_backend_name() == "nccl"
        assert acc.is_available() and acc.device_count() == torch.cuda.device_count() >= 1
        acc.set_device(0)
        assert acc.current_device() == 0 and acc.current_device_name() == "cuda:0"
        assert acc.is_bf16_supported() and acc.is_triton_supported()
        assert acc.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    else:
        assert acc.device_name() == "cpu" and acc.communication_backend_name() == "gloo"
    assert acc.device(0).type == DEVICE.type
    assert acc.on_accelerator(torch.ones(1, device=DEVICE))
    assert {torch.float, torch.half, torch.bfloat16} <= set(acc.supported_dtypes())


def test_streams_and_events_order_and_time_the_work(acc):
    side = acc.Stream()
    start, done = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    x = torch.randn(1024, 1024, device=DEVICE)
    acc.current_stream().synchronize()
    with acc.stream(side):
        start.record()
        y = x
        for _ in range(8):
            y = torch.tanh(y @ x) * 0.01
        done.record()
    acc.current_stream().wait_event(done)  # the default stream waits for the side stream's work
    total = (y * 2).sum()
    acc.synchronize()
    assert done.query()
    assert start.elapsed_time(done) > 0
    expected = x.cpu()
    for _ in range(8):
        expected = torch.tanh(expected @ x.cpu()) * 0.01
    torch.testing.assert_close(total.cpu(), (expected * 2).sum(), rtol=1e-3, atol=1e-3)
    acc.default_stream().wait_stream(side)


def test_memory_statistics_follow_allocations(acc):
    acc.empty_cache()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    block = torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE).fill_(1)  # 64 MiB
    during = acc.memory_allocated()
    if CUDA:
        assert during - before >= 64 << 20
        assert acc.memory_reserved() >= during and acc.max_memory_reserved() >= acc.memory_reserved()
        stats = acc.memory_stats()
        assert stats["allocated_bytes.all.current"] == during
        assert acc.total_memory() > acc.available_memory() > 0
        assert acc.max_memory_allocated() >= during
    del block
    acc.empty_cache()
    if CUDA:
        assert acc.memory_allocated() == before
        assert acc.max_memory_allocated() >= before + (64 << 20)  # the peak stays until reset
        acc.reset_max_memory_allocated()
        assert acc.max_memory_allocated() == before


def test_random_state_saves_and_restores_the_device_generator(acc):
    acc.manual_seed(123)
    state = acc.get_rng_state()
    first = torch.rand(1000, device=DEVICE)
    acc.set_rng_state(state)
    assert torch.equal(torch.rand(1000, device=DEVICE), first)
    acc.manual_seed_all(123)
    assert torch.equal(torch.rand(1000, device=DEVICE), first)
    if CUDA:
        assert acc.initial_seed() == 123
        assert acc.default_generator(0).device.type == "cuda"


def test_pinned_host_memory(acc):
    host = acc.pin_memory(torch.ones(1000))
    assert acc.is_pinned(host) == CUDA
    assert torch.equal(host.to(DEVICE, non_blocking=True).cpu(), torch.ones(1000))
    acc.range_push("dstrain gpu check")  # NVTX marks: no-ops without a profiler, errors if broken
    acc.range_pop()
