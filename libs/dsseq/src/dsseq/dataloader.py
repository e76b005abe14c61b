"""Shard each batch along the sequence: `shard_batch` (one batch every sequence rank holds) and
`UlyssesSPDataLoaderAdapter` (DeepSpeed's adapter over a loader whose batches differ by rank).

The adapter takes one batch from each rank of the sequence group, and then serves them one at a time:
at its i-th step every rank gets its slice of rank i's batch, so the group trains on every batch its
ranks loaded, one after the other (`len(adapter) == len(loader) * sp`). Labels are shifted over the
whole sequence before sharding (`shift_labels`, loss.py) and served as `shift_labels`; `labels` is
removed so a model does not shift them again inside its shard. `position_ids` are required: they keep
each token's global position, which the rotary embedding and causal attention read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .errors import SequenceParallelError
from .loss import IGNORE_INDEX, shard_sequence, shift_labels

REQUIRED_KEYS = ("input_ids", "position_ids")


def shard_batch(batch: Mapping[str, Any], sp_rank: int, sp_world_size: int, seq_dim: int = 1,
                ignore_index: int = IGNORE_INDEX) -> dict[str, Any]:
    """This rank's slice of every tensor of `batch` along `seq_dim`, with `labels` replaced by the
    whole sequence's `shift_labels`, sliced alike. Non-tensors are kept as they are."""
    if not isinstance(batch, Mapping):
        raise SequenceParallelError(f"a sequence-parallel batch must be a dict of tensors (input_ids, position_ids, "
                                    f"labels, ...), got {type(batch).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in batch]
    if missing:
        raise SequenceParallelError(
            f"the batch lacks {', '.join(missing)} (it has {', '.join(map(str, batch)) or 'nothing'}); "
            f"Ulysses needs position_ids in every batch so each token keeps its global position once sharded "
            f"(torch.arange(seq_len) per sample, restarting at each document for packed samples)")
    length = batch["input_ids"].shape[seq_dim]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not torch.is_tensor(value):
            out[key] = value
            continue
        if value.dim() <= seq_dim or value.shape[seq_dim] != length:
            raise SequenceParallelError(f"batch[{key!r}] of shape {tuple(value.shape)} does not have input_ids' "
                                        f"sequence length {length} at dimension {seq_dim}; every tensor of a "
                                        f"sequence-parallel batch is sharded along it")
        if key == "labels":
            key, value = "shift_labels", shift_labels(value, ignore_index, seq_dim)
        out[key] = shard_sequence(value, sp_rank, sp_world_size, seq_dim, name=f"batch[{key!r}]")
    return out


class UlyssesSPDataLoaderAdapter:
    """Wraps a loader of dict batches ([batch, seq, ...] tensors) for the ranks of `sp_group` (see the
    module's docstring). `device`: where the gathering collectives run (the group's backend device);
    the served slices stay on the CPU, as DeepSpeed's, until the training loop moves them."""

    def __init__(self, dl: Iterable[Any], sp_rank: int, sp_group: Any, sp_world_size: int,
                 device: Any = "cpu") -> None:
        self.dl = dl
        self.sp_rank = sp_rank
        self.sp_group = sp_group
        self.sp_world_size = sp_world_size
        self.device = torch.device(device)
        actual = (dist.get_rank(sp_group), dist.get_world_size(sp_group))
        if actual != (sp_rank, sp_world_size):
            raise SequenceParallelError(f"UlyssesSPDataLoaderAdapter: sp_rank={sp_rank}, sp_world_size="
                                        f"{sp_world_size}, but this rank is {actual[0]} of {actual[1]} in sp_group")
        self.iter = iter(dl)
        self.micro_batches: deque[dict[str, Any]] = deque()

    def __len__(self) -> int:
        return len(self.dl) * self.sp_world_size  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if not self.micro_batches:
            self.refill()
        return self.micro_batches.popleft()

    def refill(self) -> None:
        # Every rank reaches here together (the queue holds sp batches); one rank's end ends the epoch for all.
        try:
            batch = next(self.iter)
            ended = False
        except StopIteration:
            ended, batch = True, None
        layouts = self._gather([None if ended else _layout(batch)])
        if any(layout is None for layout in layouts):
            self.iter = iter(self.dl)  # the next epoch starts afresh, as DeepSpeed's adapter does
            raise StopIteration
        mine = _layout(batch)
        for rank, layout in enumerate(layouts):
            if layout["keys"] != mine["keys"]:
                raise SequenceParallelError(f"UlyssesSPDataLoaderAdapter: sequence rank {rank}'s batch has keys "
                                            f"{layout['keys']}, this rank's {mine['keys']}; every rank's loader must "
                                            f"yield the same keys")
        gathered: list[dict[str, Any]] = [{} for _ in layouts]
        for key in mine["keys"]:
            value = batch[key]
            if torch.is_tensor(value):
                parts = [torch.empty(layout["shapes"][key], dtype=value.dtype, device=self.device)
                         for layout in layouts]
                dscomm.all_gather(parts, value.to(self.device).contiguous(), group=self.sp_group,
                                  log_name="ulysses_batch_gather")
            else:
                parts = [layout["values"][key] for layout in layouts]
            for rank, part in enumerate(parts):
                gathered[rank][key] = part
        for whole in gathered:
            shard = shard_batch(whole, self.sp_rank, self.sp_world_size)
            self.micro_batches.append({k: v.cpu() if torch.is_tensor(v) else v for k, v in shard.items()})

    def _gather(self, mine: list[Any]) -> list[Any]:
        out: list[Any] = [None] * self.sp_world_size
        dist.all_gather_object(out, mine[0], group=self.sp_group)
        return out


def _layout(batch: Any) -> dict[str, Any]:
    """What the other ranks need to receive `batch`: its keys, tensor shapes and the non-tensor values."""
    if not isinstance(batch, Mapping):
        raise SequenceParallelError(f"UlyssesSPDataLoaderAdapter: the wrapped loader yielded a "
                                    f"{type(batch).__name__}; it must yield dicts (input_ids, position_ids, labels, "
                                    f"...)")
    return {"keys": list(batch),
            "shapes": {k: tuple(v.shape) for k, v in batch.items() if torch.is_tensor(v)},
            "values": {k: v for k, v in batch.items() if not torch.is_tensor(v)}}
