"""Which cores each rank of a node runs on (`--bind_cores_to_rank`, `--bind_core_list`), stdlib only.

The cores of a node (the `--bind_core_list`, or every core the node's processes may run on) are cut
into one equal, contiguous share per local rank, as DeepSpeed does; cores left over after the cut
stay unused. This file is also imported by the rank wrapper, which runs by path, so it imports
nothing from dstrain. Bad input raises ValueError with a message naming the value.
"""

from __future__ import annotations

import glob
import os
import re

LIST_RULE = "comma-separated core numbers and ranges, e.g. '0,2-5,7'"
_ITEM = re.compile(r"(\d+)(?:-(\d+))?")


def parse_core_list(text: str, option: str = "--bind_core_list") -> list[int]:
    """'0,2-4' -> [0, 2, 3, 4], in the order given; an empty item, a bad range or a repeat is an error."""
    cores: list[int] = []
    for item in text.split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{option} {text!r}: {item.strip()!r} is not a core number or range; "
                             f"expected {LIST_RULE}")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise ValueError(f"{option} {text!r}: range {item.strip()!r} ends before it starts; "
                             f"expected {LIST_RULE}")
        for core in range(first, last + 1):
            if core in cores:
                raise ValueError(f"{option} {text!r}: core {core} is listed twice")
            cores.append(core)
    return cores


def format_core_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (numactl's and the kernel's cpulist form)."""
    parts: list[str] = []
    start = prev = None
    for core in [*cores, None]:
        if start is not None and core == prev + 1:
            prev = core
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = core
    return ",".join(parts)


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity: a container's or cgroup's cpuset is respected)."""
    return sorted(os.sched_getaffinity(0))


def node_cores(core_list: str | None, nprocs: int, where: str = "this node") -> list[int]:
    """The cores to share among `nprocs` local ranks: the list (every core of it must be available
    here) or every available core; an error when there is not one core per rank."""
    available = available_cores()
    if core_list is None:
        cores = available
        what = f"{where} has {len(cores)} core(s) available ({format_core_list(cores)})"
    else:
        cores = parse_core_list(core_list)
        missing = [c for c in cores if c not in available]
        if missing:
            raise ValueError(f"--bind_core_list {core_list!r}: core(s) {format_core_list(missing)} are not "
                             f"available on {where} (available: {format_core_list(available)})")
        what = f"--bind_core_list {core_list!r} has {len(cores)} core(s)"
    if len(cores) < nprocs:
        raise ValueError(f"--bind_cores_to_rank: {what} for {nprocs} rank(s) there; each rank needs at least "
                         "one core: run fewer processes or list more cores")
    return cores


def share(cores: list[int], local_rank: int, nprocs: int) -> list[int]:
    """Local rank `local_rank`'s contiguous share of `cores` among `nprocs` ranks."""
    per_rank = len(cores) // nprocs
    return cores[local_rank * per_rank : (local_rank + 1) * per_rank]


def numa_node_of(cores: list[int]) -> int | None:
    """The NUMA node holding every one of `cores`, where the machine has more than one node; else None."""
    nodes: dict[int, set[int]] = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        try:
            with open(path) as f:
                text = f.read().strip()
            nodes[int(path.split("/")[-2][4:])] = set(parse_core_list(text)) if text else set()
        except (OSError, ValueError):
            return None
    if len(nodes) < 2:
        return None
    holding = [node for node, cpus in nodes.items() if set(cores) <= cpus]
    return holding[0] if holding else None
