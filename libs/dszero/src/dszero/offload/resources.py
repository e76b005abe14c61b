"""What this machine can give NVMe offload, measured here and held against the config by dsconfig's pure
`resource_problems` (where the config is loaded) and against each buffer pool before it is allocated.

Memory is the smaller of the physical memory and the cgroup's limit (a container's `memory.max`).
Queue limits come from dsaio (`queue_limits`), read only when NVMe offload is on.
"""

from __future__ import annotations

import os

import dsconfig

CGROUP_MEMORY = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_bytes() -> int:
    """The memory this process can have at most: physical memory, or less where its cgroup says so."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in CGROUP_MEMORY:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(physical, int(text))
    return physical


def machine_limits(io_engine: str | None = None) -> dsconfig.MachineLimits:
    """This machine's figures for `dsconfig.resource_problems` (loads dsaio's engines: NVMe offload only)."""
    import dsaio

    queues = dsaio.queue_limits(io_engine)
    return dsconfig.MachineLimits(memory_bytes(), queues.engine, queues.queue_depth, queues.source, queues.events,
                                  queues.threads)


def check_offload_resources(zero: dsconfig.ZeroConfig, aio: dsconfig.AioConfig,
                            machine: dsconfig.MachineLimits | None = None) -> None:
    """Refuse (dsconfig.ConfigError, every problem by key) offload sizes this machine cannot give; nothing is
    measured unless NVMe offload is on, the only offload these sizes apply to."""
    if zero.optimizer_offload_device != "nvme" and zero.param_offload_device != "nvme":
        return
    problems = dsconfig.resource_problems(zero, aio, machine or machine_limits())
    if problems:
        raise dsconfig.ConfigError(problems)
