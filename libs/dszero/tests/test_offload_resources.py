"""NVMe offload sizes against this machine's real figures: refused where the config is loaded (buffer counts,
the aio queue against the kernel's limit), and each buffer pool at its real size before its first buffer."""

import pytest

import dsconfig
import dszero
from dsconfig.resources import format_bytes
from dszero.offload.resources import machine_limits, memory_bytes
from dszero.offload.swap import BufferPool


def _config(**keys):
    cfg = dsconfig.load({"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": "/tmp", "pin_memory": True, **keys}}, "aio": {"queue_depth": 8}})
    return cfg


def test_a_billion_pinned_buffers_are_refused_naming_the_key_and_the_memory():
    cfg = _config(buffer_count=1e9)
    with pytest.raises(dsconfig.ConfigError) as info:
        dszero.check_offload_resources(cfg.zero_optimization, cfg.aio)
    assert info.value.paths == ["zero_optimization.offload_optimizer.buffer_count"]
    assert f"this machine has {format_bytes(memory_bytes())} of memory" in str(info.value)


def test_a_queue_beyond_the_kernel_limit_is_refused_naming_the_key():
    cfg = dsconfig.load({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}},
                         "aio": {"queue_depth": 1e9}})
    limits = machine_limits()
    if limits.queue_depth_limit is None:
        pytest.skip(f"the {limits.io_engine} engine has no queue limit")
    with pytest.raises(dsconfig.ConfigError) as info:
        dszero.check_offload_resources(cfg.zero_optimization, cfg.aio)
    assert info.value.paths == ["aio.queue_depth"] and limits.io_engine in str(info.value)


def test_usual_sizes_and_cpu_offload_pass():
    cfg = _config(buffer_count=8)
    dszero.check_offload_resources(cfg.zero_optimization, cfg.aio)
    cpu = dsconfig.load({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                         "aio": {"queue_depth": 1e9}})
    dszero.check_offload_resources(cpu.zero_optimization, cpu.aio)  # no NVMe: nothing is measured


def test_memory_is_at_most_the_physical_memory():
    import os

    assert 0 < memory_bytes() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("pin", [True, False])
def test_a_pool_larger_than_the_machine_is_refused_before_its_first_buffer(pin):
    # 4 KiB buffers pass the config check by the million; at their real size the pool is what must fit.
    count = memory_bytes() // (1 << 20) + 1
    with pytest.raises(dszero.ZeroConfigError, match=rf"offload_optimizer.buffer_count = {count}: {count} "
                                                     rf"{'pinned ' if pin else ''}host buffers of 1.0 MiB each"):
        BufferPool(count, 1 << 20, pin, "zero_optimization.offload_optimizer")
    pool = BufferPool(4, 1 << 20, pin, "zero_optimization.offload_optimizer")
    assert pool.total_bytes() == 4 << 20
