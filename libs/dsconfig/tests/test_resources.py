"""Sizes held against the machine's figures (given, as a caller measures them): NVMe offload's buffer
counts against memory, the aio queue against the kernel's limits; refused by key path with both figures."""

import dsconfig
from dsconfig import MachineLimits, resource_problems

GIB = 1 << 30
MACHINE = MachineLimits(memory_bytes=24 * GIB, io_engine="aio", queue_depth_limit=65536,
                        queue_depth_source="/proc/sys/fs/aio-max-nr is 65536", io_events_limit=65536,
                        threads_limit=1000)


def problems(config, machine=MACHINE):
    cfg = dsconfig.load(config)
    return resource_problems(cfg.zero_optimization, cfg.aio, machine)


def nvme(section="offload_optimizer", **keys):
    return {"zero_optimization": {"stage": 3, section: {"device": "nvme", "nvme_path": "/tmp", **keys}}}


def test_a_billion_pinned_buffers_are_refused_with_the_memory_they_take():
    found = problems(nvme(buffer_count=1e9, pin_memory=True))
    assert [p.path for p in found] == ["zero_optimization.offload_optimizer.buffer_count"]
    assert "1000000000 pinned host buffers take at least 3.7 TiB" in str(found[0])
    assert "this machine has 24.0 GiB of memory" in str(found[0])
    assert [p.path for p in problems(nvme("offload_param", buffer_count=10**8))] == [
        "zero_optimization.offload_param.buffer_count"]


def test_usual_and_cpu_offload_sizes_pass():
    assert problems(nvme(buffer_count=8)) == []
    assert problems(nvme("offload_param", buffer_count=5, buffer_size=10**12, max_in_cpu=10**12)) == []  # bounds
    cpu = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "buffer_count": 10**9}}}
    assert problems(cpu) == []  # CPU offload has no buffer pool


def test_the_aio_queue_is_held_to_the_kernel_limit_only_under_nvme_offload():
    found = problems({**nvme(), "aio": {"queue_depth": 1e9}})
    assert [p.path for p in found] == ["aio.queue_depth"]
    assert "at most 65536: /proc/sys/fs/aio-max-nr is 65536" in str(found[0])
    assert problems({"aio": {"queue_depth": 1e9}}) == []  # no NVMe offload: the section is not used
    together = problems({**nvme(), "aio": {"queue_depth": 4096, "thread_count": 32}})
    assert [p.path for p in together] == ["aio.thread_count"] and "131072 kernel I/O events" in str(together[0])
    threads = problems({**nvme(), "aio": {"thread_count": 5000}}, MachineLimits(24 * GIB, threads_limit=1000))
    assert [p.path for p in threads] == ["aio.thread_count"]


def test_unknown_limits_refuse_nothing():
    assert problems({**nvme(), "aio": {"queue_depth": 1e9}}, MachineLimits(24 * GIB)) == []
