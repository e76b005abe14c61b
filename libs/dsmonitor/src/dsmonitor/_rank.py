"""Which rank this process is, without importing torch for it."""

import os
import sys


def current_rank() -> int:
    """The global rank: torch.distributed's when a process group is up, else $RANK, else 0."""
    # Looked up in sys.modules so a torch-free training loop never pays torch's import.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    rank = os.environ.get("RANK", "0")
    try:
        return int(rank)
    except ValueError:
        from .errors import MonitorConfigError

        raise MonitorConfigError(f"the RANK environment variable must be an integer, got {rank!r}") from None
