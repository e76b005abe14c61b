"""Sizes a config asks the machine for, against what the machine has: pure arithmetic on figures the
caller measured (dsconfig reads nothing from the machine; dszero's `check_offload_resources` measures
them and calls this where the config is loaded).

Refused are only sizes that cannot work, counted low: NVMe offload's host buffers (`buffer_count`, each
at least one 4 KiB page; with real sub-groups far more) beyond the machine's memory, and an `aio`
queue deeper than the kernel lets the I/O engine make, or more I/O threads than the user may start.
`buffer_size` and `max_in_cpu` are upper bounds, not allocations, so they are not refused here;
dszero checks each buffer pool at its real size before allocating it.
"""

from __future__ import annotations

import attrs

from .errors import Problem
from .sections import AioConfig, ZeroConfig

PAGE_BYTES = 4096  # the least a host buffer of NVMe offload takes (its size is rounded up to this)
TYPICAL_BUFFERS = "4 to 8 are typical"


@attrs.frozen
class MachineLimits:
    """What this machine allows, as the caller measured it. None: no such limit, or unknown."""

    memory_bytes: int  # physical memory
    io_engine: str = "aio"  # the dsaio engine NVMe transfers would use
    queue_depth_limit: int | None = None  # events one kernel queue of that engine may hold
    queue_depth_source: str = ""  # where that limit comes from, for the message
    io_events_limit: int | None = None  # events all of the engine's queues may hold together (Linux AIO)
    threads_limit: int | None = None  # threads this user may start


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def resource_problems(zero: ZeroConfig, aio: AioConfig, machine: MachineLimits) -> list[Problem]:
    """Every size of `zero_optimization` offload and `aio` that this machine cannot give, by key path."""
    problems: list[Problem] = []
    memory = format_bytes(machine.memory_bytes)
    nvme = False
    for section, name in ((zero.offload_optimizer, "offload_optimizer"), (zero.offload_param, "offload_param")):
        if section is None or section.device != "nvme":
            continue
        nvme = True
        least = section.buffer_count * PAGE_BYTES
        if least > machine.memory_bytes:
            kind = "pinned " if section.pin_memory else ""
            problems.append(Problem(
                f"zero_optimization.{name}.buffer_count",
                f"{section.buffer_count} {kind}host buffers take at least {format_bytes(least)} (each at least one "
                f"4 KiB page, in practice a whole sub-group or parameter shard) but this machine has {memory} of "
                f"memory; {TYPICAL_BUFFERS}", section.buffer_count))
    if nvme:
        problems += _aio_problems(aio, machine)
    return problems


def _aio_problems(aio: AioConfig, machine: MachineLimits) -> list[Problem]:
    problems = []
    engine = machine.io_engine
    limit = machine.queue_depth_limit
    if limit is not None and aio.queue_depth > limit:
        problems.append(Problem("aio.queue_depth", f"is deeper than the {engine} engine's kernel queues may be here "
                                                   f"(at most {limit}: {machine.queue_depth_source}); 8 to 128 are "
                                                   f"typical", aio.queue_depth))
    events = machine.io_events_limit
    if events is not None and aio.queue_depth <= (limit or events) and aio.thread_count * aio.queue_depth > events:
        problems.append(Problem("aio.thread_count",
                                f"{aio.thread_count} threads with a queue of {aio.queue_depth} each need "
                                f"{aio.thread_count * aio.queue_depth} kernel I/O events at once, more than the "
                                f"{events} this machine allows all processes together ({machine.queue_depth_source}); "
                                f"lower aio.thread_count or aio.queue_depth", aio.thread_count))
    threads = machine.threads_limit
    if threads is not None and aio.thread_count > threads:
        problems.append(Problem("aio.thread_count", f"is more threads than this user may start (at most {threads})",
                                aio.thread_count))
    return problems
