"""`see_memory_usage`: DeepSpeed's one-line memory report at a point of a training script, on rank 0.

    see_memory_usage("after initialize", force=True)
    # after initialize | MA 0.52 GB | Max_MA 0.61 GB | CA 0.75 GB | Max_CA 0.75 GB | CPU used 3.1 / 23.4 GB (13.2%) | RSS 1.20 GB

MA / CA: the device's allocated / reserved (cached) memory and their peaks (CUDA only: nothing is created just to
measure); CPU: the machine's used and total memory (/proc/meminfo), RSS this process's resident size. Without
`force` it reports nothing, as DeepSpeed's (scripts leave the calls in and turn them on by hand).
"""

from __future__ import annotations

import logging
import sys

from ._rank import current_rank

logger = logging.getLogger("dsmonitor")
_GIB = 1024**3


def _meminfo() -> dict[str, int]:
    values = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return values


def _rss() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_usage_line(message: str) -> str:
    """The report `see_memory_usage` logs."""
    parts = [str(message)]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += [f"MA {torch.cuda.memory_allocated() / _GIB:.2f} GB",
                  f"Max_MA {torch.cuda.max_memory_allocated() / _GIB:.2f} GB",
                  f"CA {torch.cuda.memory_reserved() / _GIB:.2f} GB",
                  f"Max_CA {torch.cuda.max_memory_reserved() / _GIB:.2f} GB"]
    info = _meminfo()
    if "MemTotal" in info and "MemAvailable" in info:
        used, total = info["MemTotal"] - info["MemAvailable"], info["MemTotal"]
        parts.append(f"CPU used {used / _GIB:.1f} / {total / _GIB:.1f} GB ({100 * used / total:.1f}%)")
    rss = _rss()
    if rss is not None:
        parts.append(f"RSS {rss / _GIB:.2f} GB")
    return " | ".join(parts)


def see_memory_usage(message: str, force: bool = False) -> str | None:
    """Log the memory report on rank 0 when `force` is true (and return it there); otherwise nothing."""
    if not force or current_rank() != 0:
        return None
    line = memory_usage_line(message)
    logger.info(line)
    return line


__all__ = ["memory_usage_line", "see_memory_usage"]
