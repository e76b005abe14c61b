"""Sharded ZeRO checkpoints that load at any data-parallel world size.

Layout of a checkpoint directory:
    zero_shard_00000-of-00002.safetensors   one per rank that holds something to save: master weights
                                            and optimizer state of its groups (dsaio files), and in
                                            the header each group's layout and process group
    zero_meta.json                          written last, by rank 0: stage, step counts, loss scale
    manifest.json                           every file's size and SHA-256 (see manifest.py), checked at load

Every rank writes into `<dir>.partial`; after all have written, rank 0 adds zero_meta.json and
swaps the directory into place (the previous one is kept as `<dir>.old` until the swap is done),
so a crash at any moment leaves a complete checkpoint at `<dir>` or `<dir>.old`. Loading finds each
group by its parameters (shard_index.py) and cuts the saved elements into the shards of the current
layout: no conversion step, whether the world size or a group's process group changed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import dsaio
import dscomm

from ..errors import CheckpointError
from .atomic import swap_into_place, write_text_atomically
from .manifest import verify_manifest, write_manifest
from .param_reads import read_plan
from .shard_index import Entry, ShardIndex, layout_to_json, shard_name
from .writers import is_shared_file_writer

if TYPE_CHECKING:
    from ..optimizer import ZeroOptimizer

META = "zero_meta.json"
FORMAT = "dszero-sharded-2"
RECORD = "record"  # the caller's record: a key of each shard's metadata and of zero_meta.json
_RECORD: ContextVar[Mapping[str, Any] | None] = ContextVar("dszero_checkpoint_record", default=None)


@contextmanager
def recording(record: Mapping[str, Any]) -> Iterator[None]:
    """Saves inside the block store `record` (see `save`): for callers that save through
    `ZeroOptimizer.save`, which takes no record of its own."""
    token = _RECORD.set(dict(record))
    try:
        yield
    finally:
        _RECORD.reset(token)


def save(zero: ZeroOptimizer, directory: str | os.PathLike, *, node_local: bool = False,
         record: Mapping[str, Any] | None = None) -> Path:
    """Write this rank's shards; collective (every rank of the data-parallel group calls it).

    node_local: `directory` is on each node's own disk (no shared file system): every node's local
    rank 0 also writes the metadata (and, at stage 0, the replicated groups), so each node holds
    what its ranks need to load.
    record: the caller's description of this rank's save (JSON-able: which save, which step, where the
    rank sits in a larger layout), stored in its shard file's metadata under "record" and, from the
    rank that writes it, in zero_meta.json; default: what `recording` set. The caller checks it at load.
    """
    record = dict(record if record is not None else _RECORD.get() or {})
    final = checkpoint_directory(directory)
    partial = final.with_name(final.name + ".partial")
    organiser = is_shared_file_writer(final.parent, zero.process_group, node_local)
    if organiser:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=zero.process_group)
    state = zero.optimizer.state_dict()
    mine = [i for i, group in enumerate(zero.groups) if _writes(zero, group, node_local)]
    if mine:
        tensors, entries = _shard_tensors(zero, state, mine)
        metadata = {"rank": str(zero.rank), "groups": json.dumps(entries)}
        if record:
            metadata[RECORD] = json.dumps(record, sort_keys=True)
        dsaio.save(tensors, partial / shard_name(zero.rank, zero.world), metadata=metadata)
    dscomm.barrier(group=zero.process_group)
    if organiser:
        meta = {"format": FORMAT, "zero_stage": zero.stage, "world_size": zero.world,
                "precision": zero.precision.dtype, "scaler": zero.scaler.state_dict(),
                "skipped_steps": zero.skipped_steps, "group_count": len(zero.groups),
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]}
        if record:
            meta[RECORD] = record
        write_text_atomically(partial / META, json.dumps(meta, indent=1))
        write_manifest(partial)
        swap_into_place(partial, final)
    dscomm.barrier(group=zero.process_group)
    return final


def _as_json_read(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The saved hyperparameters, with the tuples JSON turned into lists (Adam's betas) tuples again where the
    optimizer's own value is one, so a loaded optimizer's groups read as they did when saved."""
    return {key: tuple(value) if isinstance(value, list) and isinstance(current.get(key), tuple) else value
            for key, value in saved.items()}


def shard_path(zero: ZeroOptimizer, directory: str | os.PathLike) -> Path:
    """The file of the ZeRO checkpoint `directory` that holds this rank's optimizer state (master weights and the
    optimizer's per-element state): its own shard where the stage partitions the state, else (stage 0, state
    replicated) the shard of the group's first rank, which writes it."""
    own = any(_writes(zero, group, node_local=False) for group in zero.groups)
    return checkpoint_directory(directory) / shard_name(zero.rank if own else 0, zero.world)


def _writes(zero: ZeroOptimizer, group: Any, node_local: bool) -> bool:
    """As the stage saves (policies/save.py): partitioned groups every rank its shard, replicated ones
    their group's rank 0 (and with node-local storage every node's local rank 0 too)."""
    return zero.policies.save.writes(group, node_local)


def _shard_tensors(zero: ZeroOptimizer, state: dict[str, Any], indices: list[int]
                   ) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for index in indices:
        flat = zero.groups[index]
        # fp32, or fp64 masters as they are (precision "fp64"), so a resumed run continues bit for bit.
        tensors[f"group{index}.master"] = flat.master.detach().to(_saved_dtype(flat.master.dtype)).contiguous()
        scalars: dict[str, Any] = {}
        for key, value in state["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.numel() == flat.shard_numel:
                tensors[f"group{index}.state.{key}"] = value.detach().contiguous()
            else:  # a step count or another per-group scalar
                scalars[key] = value.item() if torch.is_tensor(value) else value
        entries.append({"index": index, "group_world": flat.layout.world_size, "group_rank": flat.shard_rank,
                        "layout": layout_to_json(flat.layout), "scalars": scalars})
    return tensors, entries


def _saved_dtype(master_dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(master_dtype, torch.float32)


def checkpoint_directory(directory: str | os.PathLike) -> Path:
    """`directory` made absolute and normal; refused when it names no directory of its own (".", "/").

    A save renames the directory aside and replaces it, so a path that resolves to a parent of other
    data ("x/..", "/") would move that data."""
    given = Path(os.fspath(directory))
    path = Path(os.path.abspath(given))
    if given.name in ("", ".", "..") or path.name == "":
        raise CheckpointError(f"{os.fspath(directory)!r} is not a checkpoint directory of its own (it resolves to "
                              f"{path}); give a path whose last part names the checkpoint, e.g. ckpt/step100")
    if path.is_dir() and any(path.iterdir()) and not (path / META).is_file():
        raise CheckpointError(f"{path} exists and is not a ZeRO checkpoint ({META} missing); a save replaces its "
                              f"directory, so it refuses to replace this one: choose a new or empty directory")
    return path


def resolve_directory(directory: str | os.PathLike) -> Path:
    """The complete checkpoint at `directory`, or the `.old` one an interrupted save left."""
    path = Path(directory)
    for candidate in (path, path.with_name(path.name + ".old")):
        if (candidate / META).is_file():
            return candidate
    if path.with_name(path.name + ".partial").exists():
        raise CheckpointError(f"{path}: the last save did not finish (no {META}; a {path.name}.partial directory "
                              f"is left) and no earlier complete checkpoint is there")
    raise CheckpointError(f"{path}: no ZeRO checkpoint here ({META} not found)")


def read_meta(directory: Path) -> dict[str, Any]:
    verify_manifest(directory)
    try:
        meta = json.loads((directory / META).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{directory / META}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{directory / META}: unknown format; expected {FORMAT}")
    return meta


def load(zero: ZeroOptimizer, directory: str | os.PathLike, load_optimizer_states: bool = True) -> None:
    """Load a checkpoint saved at any world size into `zero` (each rank reads what its shards need)."""
    path = resolve_directory(directory)
    meta = read_meta(path)
    if meta["group_count"] != len(zero.groups):
        raise CheckpointError(f"{path}: the checkpoint has {meta['group_count']} parameter group(s), this optimizer "
                              f"{len(zero.groups)}; is it the same model and optimizer?")
    index = ShardIndex(path)
    optimizer_state: dict[int, dict[str, Any]] = {}
    for position, flat in enumerate(zero.groups):
        # By the group's parameters, or parameter by parameter where they were grouped otherwise (experts).
        reads = read_plan(index, flat, zero.rank)
        if reads is None:
            raise CheckpointError(_mismatch(index, flat, position, path))
        master = torch.zeros(flat.shard_numel, dtype=_saved_dtype(flat.master.dtype))
        _gather_pieces(master, reads, index, "master")
        flat.master.copy_(master)
        if load_optimizer_states:
            home = _home(index, flat, reads)
            per_param: dict[str, Any] = {}
            for key in index.state_keys(home):
                sample = index.tensor(home, f"state.{key}")
                value = torch.zeros(flat.shard_numel, dtype=sample.dtype)
                _gather_pieces(value, reads, index, f"state.{key}")
                per_param[key] = value
            for key, value in home.scalars.items():
                per_param[key] = torch.tensor(value, dtype=torch.float32) if key == "step" else value
            if per_param:
                optimizer_state[position] = per_param
    if load_optimizer_states:
        current = zero.optimizer.state_dict()["param_groups"]
        groups = [{**_as_json_read(hyper, group), "params": group["params"]}
                  for hyper, group in zip(meta["param_groups"], current)]
        zero.optimizer.load_state_dict({"state": optimizer_state, "param_groups": groups})
        zero.scaler.load_state_dict(meta["scaler"])
        zero.skipped_steps = int(meta.get("skipped_steps", 0))
    for flat in zero.groups:
        flat.master_to_model()
    zero._share_updated_weights()


def _home(index: ShardIndex, flat: Any, reads: list) -> Entry:
    """A saved entry of this group, whose state keys and per-group scalars (the step) are taken."""
    if reads:
        return reads[0][0]
    first = flat.layout.slots[0]  # this rank's shard holds only padding: any holder of the group will do
    return next(e for e in index.entries if any(s.name == first.name for s in e.layout.slots))


def _gather_pieces(target: torch.Tensor, reads, index: ShardIndex, kind: str) -> None:
    for entry, start, end, at in reads:
        target[at: at + end - start].copy_(index.tensor(entry, kind)[start:end].to(target.dtype))


def _mismatch(index: ShardIndex, flat: Any, position: int, path: Path) -> str:
    current = [(s.name, tuple(s.shape)) for s in flat.layout.slots]
    same_index = [e for e in index.entries if e.index == position]
    saved = list(same_index[0].key) if same_index else []
    missing = sorted({n for n, _ in current} - {n for n, _ in saved})[:3]
    extra = sorted({n for n, _ in saved} - {n for n, _ in current})[:3]
    shapes = [f"{n}: saved {a} now {b}" for (n, a), (m, b) in zip(saved, current) if n == m and a != b][:3]
    return (f"{path}: parameter group {position} does not match this model (not in the checkpoint: "
            f"{missing or 'none'}; only in the checkpoint: {extra or 'none'}; shapes differ: {shapes or 'none'})")
