"""`save_checkpoint`: every part of the run writes its state under `save_dir/<tag>` (protocol.py).

1. Everything a save can refuse is refused on every rank before any rank writes: the tag, and the
   common and rank entries (dsaio's declared plain types only; nothing is pickled).
2. Every rank agrees on the tag (checkpoint.tag_validation) and on a fresh save id, which every file
   records (records.py).
3. Every rank writes into `<tag>.partial` (its own directory for the layout: tp_RR_of_SS/,
   pipe_RR_of_SS/), then one rank writes the common file and the manifest, swaps `<tag>.partial` into
   place and updates `latest`: a crash at any moment leaves the previous checkpoint and `latest` as they
   were. With use_node_local_storage every node's local rank 0 does that on its own disk.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

import dsaio
import dscomm
from dszero.checkpoint import is_shared_file_writer, swap_into_place, write_manifest, write_text_atomically

from ..errors import CheckpointTagError, DstrainError
from ..logs import log_on_rank0
from .files import COMMON_FILE, engine_file
from .layout import RunLayout
from .paths import LATEST, check_tag
from .protocol import SaveTarget
from .records import new_save_id
from .recovery_script import write_recovery_script
from .run_parts import checkpoint_parts

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts


def save_checkpoint(parts: TrainingParts, save_dir: Any, tag: Any, client_state: dict, save_latest: bool, *,
                    exclude_frozen_parameters: bool = False) -> bool:
    if parts.optimizer is None:
        raise DstrainError("save_checkpoint() needs an optimizer: a checkpoint is the training state")
    if save_dir is None or not str(save_dir):  # "" would be the working directory, as Path("") reads it
        raise ValueError(f"save_checkpoint(save_dir={save_dir!r}): save_dir must name the checkpoint's directory")
    layout = RunLayout.of(parts)
    steps = parts.progress.global_steps
    tag = check_tag(str(tag) if tag is not None else f"global_step{steps}")
    out = SaveTarget(layout, steps, node_local=parts.config.checkpoint.use_node_local_storage)
    out.common.update({"layout": layout.describe(), "dp_world_size": layout.dp_size, "zero_stage": layout.zero_stage,
                       "global_steps": steps})
    for part in checkpoint_parts(parts, layout, client_state=client_state, exclude_frozen=exclude_frozen_parameters):
        part.save(out)
    _check_storable(out.common, out.rank)
    world = layout.world_group
    tag = _agreed_tag(tag, world, parts.global_rank, parts.config.checkpoint.tag_validation)
    root = Path(save_dir)
    final, partial = root / tag, root / f"{tag}.partial"
    if final.is_dir() and any(final.iterdir()) and not (final / COMMON_FILE).is_file():
        raise DstrainError(f"{final} exists and is not a dstrain checkpoint ({COMMON_FILE} missing); a save replaces "
                           f"its tag's directory, so it refuses to replace this one: choose another tag")
    out.save_id = new_save_id(world)
    writer = is_shared_file_writer(root, world, out.node_local)
    if writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=world)
    out.top, out.directory = partial, layout.shard_directory(partial)
    out.directory.mkdir(parents=True, exist_ok=True)
    dscomm.barrier(group=world)
    out.writes_shard_files = is_shared_file_writer(out.directory, layout.dp_group, out.node_local)
    for action in out.writes:
        action()
    dsaio.save_state_dict(out.rank, out.directory / engine_file(layout.dp_rank),
                          metadata=out.record("rank", dp=layout.dp_rank))
    if writer:
        dsaio.save_state_dict(out.common, partial / COMMON_FILE, metadata=out.record("common", placed=False))
    dscomm.barrier(group=world)
    if writer:
        write_manifest(partial)
        swap_into_place(partial, final)
        if save_latest:
            write_text_atomically(root / LATEST, tag)
        if layout.zero_stage > 0:  # as DeepSpeed, beside its ZeRO checkpoints
            write_recovery_script(root)
    dscomm.barrier(group=world)
    log_on_rank0(parts.global_rank, f"saved checkpoint {final}")
    return True


def _check_storable(*entries: dict) -> None:
    # client_state and the scheduler's state_dict are the caller's objects: only declared types are stored.
    for state in entries:
        try:
            dsaio.check_state_dict(state)
        except TypeError as exc:
            raise DstrainError(f"save_checkpoint: {exc}; nothing was saved") from None


def _agreed_tag(tag: str, group: Any, global_rank: int, mode: str) -> str:
    """The tag every rank saves under: Fail refuses differing tags, Warn warns and takes the first rank's."""
    if mode == "Ignore" or dist.get_world_size(group) == 1:
        return tag
    digest = int.from_bytes(hashlib.sha1(tag.encode()).digest()[:7], "little")
    low = torch.tensor([digest], dtype=torch.int64)
    high = low.clone()
    dscomm.all_reduce(low, op=dscomm.ReduceOp.MIN, group=group, log_name="checkpoint_tag")
    dscomm.all_reduce(high, op=dscomm.ReduceOp.MAX, group=group, log_name="checkpoint_tag")
    if low.item() == high.item():
        return tag
    message = (f"checkpoint tag {tag!r} on rank {global_rank} differs from another rank's tag; every rank must "
               f"save under the same tag (checkpoint.tag_validation is {mode})")
    if mode == "Fail":
        raise CheckpointTagError(message)
    warnings.warn(message + "; saving under rank 0's tag", stacklevel=4)
    return _first_rank_text(tag, group)


def _first_rank_text(text: str, group: Any) -> str:
    encoded = torch.tensor(list(text.encode()), dtype=torch.uint8)
    length = torch.tensor([encoded.numel()], dtype=torch.int64)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dscomm.broadcast(length, src, group=group, log_name="checkpoint_tag")
    buffer = torch.zeros(int(length.item()), dtype=torch.uint8)
    buffer[: min(encoded.numel(), buffer.numel())] = encoded[: buffer.numel()]
    dscomm.broadcast(buffer, src, group=group, log_name="checkpoint_tag")
    return bytes(buffer.tolist()).decode()
