"""Who writes the files every rank of a checkpoint shares.

On shared storage that is rank 0 of the group. With node-local storage each node keeps its own copy,
so each node's local rank 0 writes one; but "node-local" directories may turn out to be shared (two
nodes mounting one file system, or two launches on one host), and two writers creating and swapping
the same directory destroy each other's files. So the candidates find out: each drops a marker file
into the directory, and after a barrier the lowest-ranked candidate whose marker it sees writes for
everyone who sees the same markers. No candidate needs to know the others' disks in advance.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dscomm

_log = logging.getLogger("dszero")
_MARKER = ".dszero-writer-"


def is_shared_file_writer(directory: Path, group: Any, node_local: bool) -> bool:
    """Whether this rank writes `directory`'s shared files (collective over `group`)."""
    if not node_local:
        return dist.get_rank(group) == 0
    candidate = dscomm.get_local_rank() == 0
    nonce = _common_nonce(group)
    me = dist.get_rank()
    marker = directory / f"{_MARKER}{nonce}-{me}"
    if candidate:
        directory.mkdir(parents=True, exist_ok=True)
        marker.touch()
    dscomm.barrier(group=group)
    writer = False
    if candidate:
        seen = sorted(int(p.name.rsplit("-", 1)[1]) for p in directory.glob(f"{_MARKER}{nonce}-*"))
        writer = seen[0] == me
        if len(seen) > 1 and writer:
            _log.warning("use_node_local_storage: ranks %s (local rank 0 of their nodes) see the same directory %s; "
                         "it is shared, so rank %d writes its common files for all of them", seen, directory, me)
    dscomm.barrier(group=group)  # every candidate has looked before any marker goes
    if candidate:
        marker.unlink(missing_ok=True)
    return writer


def _common_nonce(group: Any) -> int:
    # A fresh name per save, so markers left by a killed save are never counted.
    value = torch.tensor([secrets.randbits(62) if dist.get_rank(group) == 0 else 0], dtype=torch.int64)
    dscomm.broadcast(value, dist.get_global_rank(group, 0) if group is not None else 0, group=group,
                     log_name="checkpoint_writer_nonce")
    return int(value.item())

