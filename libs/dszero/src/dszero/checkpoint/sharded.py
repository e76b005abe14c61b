"""Sharded ZeRO checkpoints that load at any data-parallel world size.

Layout of a checkpoint directory:
    zero_shard_00000-of-00002.safetensors   one per rank: master weights and optimizer state (dsaio files)
    zero_meta.json                          written last, by rank 0: layouts, step counts, loss scale
    manifest.json                           every file's size and SHA-256 (see manifest.py), checked at load

Every rank writes into `<dir>.partial`; after all have written, rank 0 adds zero_meta.json and
swaps the directory into place (the previous one is kept as `<dir>.old` until the swap is done),
so a crash at any moment leaves a complete checkpoint at `<dir>` or `<dir>.old`. Loading cuts the
saved elements into the shards of the current world size: no conversion step.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import dsaio
import dscomm

from ..errors import CheckpointError
from ..layout import GroupLayout, Slot, reshard_reads
from .atomic import swap_into_place, write_text_atomically
from .manifest import verify_manifest, write_manifest
from .writers import is_shared_file_writer

if TYPE_CHECKING:
    from ..optimizer import ZeroOptimizer

META = "zero_meta.json"
FORMAT = "dszero-sharded-1"


def shard_name(rank: int, world: int) -> str:
    return f"zero_shard_{rank:05d}-of-{world:05d}.safetensors"


def save(zero: ZeroOptimizer, directory: str | os.PathLike, *, node_local: bool = False) -> Path:
    """Write this rank's shard; collective (every rank of the data-parallel group calls it).

    node_local: `directory` is on each node's own disk (no shared file system): every node's local
    rank 0 also writes the metadata, so each node holds what its ranks need to load.
    """
    final = checkpoint_directory(directory)
    partial = final.with_name(final.name + ".partial")
    saved_world = zero.world if zero.stage >= 1 else 1
    writer = zero.rank < saved_world
    organiser = is_shared_file_writer(final.parent, zero.process_group, node_local)
    if organiser:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=zero.process_group)
    state = zero.optimizer.state_dict()
    if writer:
        tensors, scalars = _shard_tensors(zero, state)
        dsaio.save(tensors, partial / shard_name(zero.rank, saved_world),
                   metadata={"rank": str(zero.rank), "scalars": json.dumps(scalars)})
    dscomm.barrier(group=zero.process_group)
    if organiser:
        meta = {"format": FORMAT, "zero_stage": zero.stage, "world_size": saved_world,
                "precision": zero.precision.dtype, "scaler": zero.scaler.state_dict(),
                "skipped_steps": zero.skipped_steps,
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]],
                "layouts": [_layout_to_json(flat.layout) for flat in zero.groups]}
        write_text_atomically(partial / META, json.dumps(meta, indent=1))
        write_manifest(partial)
        swap_into_place(partial, final)
    dscomm.barrier(group=zero.process_group)
    return final


def _shard_tensors(zero: ZeroOptimizer, state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for index, flat in enumerate(zero.groups):
        tensors[f"group{index}.master"] = flat.master.detach().float().contiguous()
        for key, value in state["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.numel() == flat.shard_numel:
                tensors[f"group{index}.state.{key}"] = value.detach().contiguous()
            else:  # a step count or another per-group scalar
                scalars[f"{index}.{key}"] = value.item() if torch.is_tensor(value) else value
    return tensors, scalars


def _layout_to_json(layout: GroupLayout) -> dict[str, Any]:
    return {"world_size": layout.world_size, "alignment": layout.alignment,
            "slots": [[s.name, list(s.shape), s.offset, s.numel] for s in layout.slots]}


def _layout_from_json(data: dict[str, Any]) -> GroupLayout:
    slots = tuple(Slot(name, tuple(shape), offset, numel) for name, shape, offset, numel in data["slots"])
    return GroupLayout(slots, data["world_size"], data["alignment"])


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
    """Load a checkpoint saved at any world size into `zero` (each rank reads what its shard needs)."""
    path = resolve_directory(directory)
    meta = read_meta(path)
    layouts = [_layout_from_json(d) for d in meta["layouts"]]
    _check_same_model(zero, layouts, path)
    new_world = zero.world if zero.stage >= 1 else 1
    my_rank = zero.rank if zero.stage >= 1 else 0
    shards = ShardFiles(path, meta["world_size"], home=my_rank if my_rank < meta["world_size"] else 0)
    state_keys = shards.state_keys()
    scalars = shards.scalars()
    optimizer_state: dict[int, dict[str, Any]] = {}
    for index, (flat, old) in enumerate(zip(zero.groups, layouts)):
        reads = reshard_reads(old, new_world, my_rank)
        master = torch.zeros(flat.shard_numel, dtype=torch.float32)
        _gather_pieces(master, reads, lambda r, i=index: shards.tensors(r)[f"group{i}.master"])
        flat.master.copy_(master)
        if load_optimizer_states:
            per_param: dict[str, Any] = {}
            for key in state_keys.get(index, []):
                sample = shards.tensors(shards.home)[f"group{index}.state.{key}"]
                value = torch.zeros(flat.shard_numel, dtype=sample.dtype)
                _gather_pieces(value, reads, lambda r, i=index, k=key: shards.tensors(r)[f"group{i}.state.{k}"])
                per_param[key] = value
            for name, value in scalars.items():
                group_index, key = name.split(".", 1)
                if int(group_index) == index:
                    per_param[key] = torch.tensor(value, dtype=torch.float32) if key == "step" else value
            if per_param:
                optimizer_state[index] = per_param
    if load_optimizer_states:
        current = zero.optimizer.state_dict()["param_groups"]
        groups = [{**hyper, "params": group["params"]} for hyper, group in zip(meta["param_groups"], current)]
        zero.optimizer.load_state_dict({"state": optimizer_state, "param_groups": groups})
        zero.scaler.load_state_dict(meta["scaler"])
        zero.skipped_steps = int(meta.get("skipped_steps", 0))
    for flat in zero.groups:
        flat.master_to_model()
    zero._share_updated_weights()


def _gather_pieces(target: torch.Tensor, reads, source) -> None:
    for old_rank, start, end, at in reads:
        target[at: at + end - start].copy_(source(old_rank)[start:end].to(target.dtype))


class ShardFiles:
    """The shard files of one checkpoint, each read once, on first use."""

    def __init__(self, path: Path, world: int, home: int = 0):
        self.path = path
        self.world = world
        self.home = home  # the shard read for what every shard holds alike (this rank's own, where it exists)
        self._loaded: dict[int, tuple[dict[str, torch.Tensor], dict[str, str]]] = {}

    def _load(self, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        if rank not in self._loaded:
            file = self.path / shard_name(rank, self.world)
            if not file.is_file():
                raise CheckpointError(f"{self.path}: shard {file.name} of the {self.world}-rank checkpoint is missing")
            self._loaded[rank] = dsaio.load_with_metadata(file, framework="pt")
        return self._loaded[rank]

    def tensors(self, rank: int) -> dict[str, torch.Tensor]:
        return self._load(rank)[0]

    def scalars(self) -> dict[str, Any]:
        """Per-group optimizer scalars (step counts), the same on every rank: read from the home shard."""
        return json.loads(self._load(self.home)[1]["scalars"])

    def state_keys(self) -> dict[int, list[str]]:
        """Optimizer state names per group (exp_avg, ...), from the home shard's tensor names."""
        keys: dict[int, list[str]] = {}
        for name in self.tensors(self.home):
            group, kind, *rest = name.split(".", 2)
            if kind == "state":
                keys.setdefault(int(group.removeprefix("group")), []).append(rest[0])
        return keys


def _check_same_model(zero: ZeroOptimizer, layouts: list[GroupLayout], path: Path) -> None:
    if len(layouts) != len(zero.groups):
        raise CheckpointError(f"{path}: the checkpoint has {len(layouts)} parameter group(s), this optimizer "
                              f"{len(zero.groups)}; is it the same model and optimizer?")
    for index, (flat, old) in enumerate(zip(zero.groups, layouts)):
        saved = [(s.name, s.shape) for s in old.slots]
        current = [(s.name, s.shape) for s in flat.layout.slots]
        if saved != current:
            missing = sorted({n for n, _ in current} - {n for n, _ in saved})[:3]
            extra = sorted({n for n, _ in saved} - {n for n, _ in current})[:3]
            shapes = [f"{n}: saved {tuple(a)} now {tuple(b)}" for (n, a), (m, b) in zip(saved, current)
                      if n == m and tuple(a) != tuple(b)][:3]
            raise CheckpointError(f"{path}: parameter group {index} does not match this model "
                                  f"(not in the checkpoint: {missing or 'none'}; only in the checkpoint: "
                                  f"{extra or 'none'}; shapes differ: {shapes or 'none'})")

