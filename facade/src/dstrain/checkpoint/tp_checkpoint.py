"""Checkpoints of a tensor-parallel model (dstp): one sub-directory per tensor rank, and loading at
another autotp_size by merging the shards and cutting them anew by the plan.

    <tag>/engine_common.safetensors     scheduler, client state, the plan (JSON) and its tp_size
    <tag>/tp_00_of_02/                  what a data-parallel save writes, for tensor rank 0: the ZeRO
    <tag>/tp_01_of_02/                  shards over its data group, its module shard, each rank's state
    <tag>/manifest.json                 every file above, checked before anything is loaded

Every rule of the plain checkpoints holds (engine_checkpoint.py): tags checked before writing, a
`.partial` directory swapped into place when every rank has written, `latest` after that, dsaio
files only (no pickle). At the same autotp_size each tensor rank loads its own sub-directory; at
another one the weights, the fp32 masters and the optimizer's per-element state (Adam's moments) of
every saved tensor rank are merged parameter by parameter and cut for this rank by the plan.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import dsaio
import dscomm
import dszero
from dszero.checkpoint import (
    is_shared_file_writer,
    load_parameter_states,
    read_parameter_states,
    swap_into_place,
    write_manifest,
    write_text_atomically,
)

from ..errors import CheckpointLoadError, DstrainError
from ..logs import log_on_rank0
from ..wiring.optional_libs import LazyLibrary, imported
from . import engine_checkpoint as plain
from .paths import LATEST, check_tag

# dstp is optional: a model is tensor-parallel only once dstp is imported (tensor_state is None without it).
dstp = LazyLibrary("dstp", "a tensor-parallel checkpoint")

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts

TP_SIZE = "tp_size"  # in the common file
TP_PLAN = "tp_plan"


def tp_directory(rank: int, size: int) -> str:
    return f"tp_{rank:02d}_of_{size:02d}"


def tensor_state(parts: TrainingParts) -> dstp.TensorParallelModel | None:
    if not imported("dstp"):
        return None
    state = dstp.state_of(parts.module)
    return state if state is not None and state.tp_size > 1 else None


def _world_group(parts: TrainingParts) -> Any:
    return parts.groups.world if parts.groups is not None else None


# ---------------------------------------------------------------------------------------------- save
def save_checkpoint(parts: TrainingParts, save_dir, tag: Any, client_state: dict, save_latest: bool, *,
                    exclude_frozen_parameters: bool = False) -> bool:
    state = tensor_state(parts)
    steps = parts.progress.global_steps
    tag = check_tag(str(tag) if tag is not None else f"global_step{steps}")
    common = {"lr_scheduler": parts.lr_scheduler.state_dict() if parts.lr_scheduler is not None else None,
              "client_state": client_state, "dp_world_size": parts.dp_world_size,
              "zero_stage": parts.config.zero_optimization.stage, "global_steps": steps,
              TP_SIZE: state.tp_size, TP_PLAN: state.plan.to_json()}
    excluded = plain._frozen_names(parts.module) if exclude_frozen_parameters else []
    if excluded:
        common[plain.EXCLUDED_FROZEN] = excluded
    plain._check_storable(common)
    tag = plain._validate_tag(parts, tag)
    root = Path(save_dir)
    final, partial = root / tag, root / f"{tag}.partial"
    if final.is_dir() and any(final.iterdir()) and not (final / plain.COMMON_FILE).is_file():
        raise DstrainError(f"{final} exists and is not a dstrain checkpoint ({plain.COMMON_FILE} missing); a save "
                           f"replaces its tag's directory, so it refuses to replace this one: choose another tag")
    world = _world_group(parts)
    node_local = parts.config.checkpoint.use_node_local_storage
    writer = is_shared_file_writer(root, world, node_local)
    if writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=world)
    mine = partial / tp_directory(state.tp_rank, state.tp_size)
    if parts.dp_rank == 0:
        mine.mkdir(parents=True, exist_ok=True)
    dscomm.barrier(group=world)
    parts.optimizer.save(mine / plain.ZERO_DIR, node_local=node_local)  # over this tensor rank's data group
    dsaio.save_state_dict(plain._rank_state(parts), mine / plain.engine_file(parts.dp_rank))
    if parts.dp_rank == 0:
        dsaio.save_state_dict(plain._module_state(parts, set(excluded)), mine / plain.MODEL_FILE)
    if writer:
        dsaio.save_state_dict(common, partial / plain.COMMON_FILE)
    dscomm.barrier(group=world)
    if writer:
        write_manifest(partial)
        swap_into_place(partial, final)
        if save_latest:
            write_text_atomically(root / LATEST, tag)
    dscomm.barrier(group=world)
    log_on_rank0(parts.global_rank, f"saved checkpoint {final} ({state.tp_size} tensor ranks)")
    return True


# ---------------------------------------------------------------------------------------------- load
def saved_tensor_dirs(path: Path, common: dict) -> list[Path]:
    """The tensor ranks' sub-directories of a checkpoint, in rank order ([path] itself when saved without TP)."""
    size = saved_tp_size(common, path)
    if size == 1:
        return [path]
    dirs = [path / tp_directory(rank, size) for rank in range(size)]
    missing = [d.name for d in dirs if not d.is_dir()]
    if missing:
        raise CheckpointLoadError(f"{path}: saved with {size} tensor ranks but {missing} are missing")
    return dirs


def load_checkpoint(parts: TrainingParts, path: Path, common: dict, *, load_module_strict: bool,
                    load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool
                    ) -> tuple[str, Any]:
    """Load `path` (verified) into a tensor-parallel run, or a tensor-parallel checkpoint into any run."""
    state = dstp.state_of(parts.module)
    tp_size = state.tp_size if state is not None else 1
    tp_rank = state.tp_rank if state is not None else 0
    dirs = saved_tensor_dirs(path, common)
    optimizer = parts.optimizer
    if len(dirs) == tp_size:
        mine = dirs[tp_rank]
        plain._load_module(parts, mine, common, load_module_strict)
        if load_module_only or optimizer is None:
            if optimizer is not None:
                plain._masters_from(parts, mine)
        else:
            optimizer.load(mine / plain.ZERO_DIR, load_optimizer_states=load_optimizer_states)
    else:
        _load_resharded(parts, dirs, common, state, tp_rank, tp_size, strict=load_module_strict)
        if optimizer is not None:
            _load_resharded_optimizer(parts, dirs, common, state, tp_rank, tp_size,
                                      load_optimizer_states and not load_module_only)
    if not load_module_only and optimizer is not None:
        if load_lr_scheduler_states and parts.lr_scheduler is not None and common["lr_scheduler"] is not None:
            parts.lr_scheduler.load_state_dict(common["lr_scheduler"])
        plain._load_rank_state(parts, dirs[min(tp_rank, len(dirs) - 1)], common)
    dscomm.barrier(group=_world_group(parts))
    log_on_rank0(parts.global_rank, f"loaded checkpoint {path} (saved with {len(dirs)} tensor rank(s), now {tp_size})")
    return str(path), common["client_state"]


def _saved_plan(common: dict, dirs: list[Path]) -> dstp.TensorParallelPlan | None:
    if len(dirs) == 1:
        return None
    raw = common.get(TP_PLAN)
    if not isinstance(raw, str):
        raise CheckpointLoadError(f"{dirs[0].parent}: saved with {len(dirs)} tensor ranks but no plan is recorded")
    try:
        return dstp.TensorParallelPlan.from_json(raw)
    except dstp.TensorParallelError as exc:
        raise CheckpointLoadError(f"{dirs[0].parent}: {exc}") from None


def _whole_state(dirs: list[Path], saved: dstp.TensorParallelPlan | None) -> dict[str, torch.Tensor]:
    """Every saved tensor, whole: the module files plus the fp32 masters (which override the module's
    copies of the trained weights), merged over the saved tensor ranks by the saved plan."""
    per_rank = []
    for directory in dirs:
        tensors = dict(dsaio.load_state_dict(directory / plain.MODEL_FILE))
        zero_dir = directory / plain.ZERO_DIR
        if zero_dir.is_dir():
            tensors.update(dszero.get_fp32_state_dict_from_zero_checkpoint(zero_dir))
        per_rank.append(tensors)
    whole = {}
    for name in per_rank[0]:
        shards = [tensors[name] for tensors in per_rank]
        pp = saved.params.get(name) if saved is not None else None
        whole[name] = dstp.merge_shards(shards, pp) if pp is not None and pp.sharded else shards[0]
    return whole


def _load_resharded(parts: TrainingParts, dirs: list[Path], common: dict, state: Any, tp_rank: int, tp_size: int,
                    *, strict: bool) -> None:
    whole = _whole_state(dirs, _saved_plan(common, dirs))
    module = parts.module
    current = state.plan.params if state is not None else {}
    sharded = plain._parameters_in_shards(parts)
    with dszero.GatheredParameters(list(module.parameters()), modifier_rank=0, enabled=sharded), torch.no_grad():
        targets = module.state_dict(keep_vars=True)  # what a checkpoint holds: no non-persistent buffers
        missing = sorted(set(targets) - set(whole))
        if strict and missing:
            raise CheckpointLoadError(f"{dirs[0].parent} does not hold {missing[:5]} (load_module_strict=False loads "
                                      f"the rest)")
        for name, target in targets.items():
            if name not in whole:
                continue
            pp = current.get(name)
            value = dstp.shard_tensor(whole[name], pp, tp_rank, tp_size) if pp is not None else whole[name]
            if tuple(value.shape) != tuple(target.shape):
                raise CheckpointLoadError(f"{name}: {tuple(value.shape)} after cutting for tensor rank {tp_rank} of "
                                          f"{tp_size}, but the model holds {tuple(target.shape)}")
            target.data.copy_(value.to(target.dtype))
    if parts.optimizer is not None and not sharded:
        parts.optimizer.masters_from_module()


def _load_resharded_optimizer(parts: TrainingParts, dirs: list[Path], common: dict, state: Any, tp_rank: int,
                              tp_size: int, with_states: bool) -> None:
    """The fp32 masters and the optimizer's per-element state (Adam's moments) of every saved tensor rank,
    merged by the saved plan and cut by the current one into this rank's ZeRO shards."""
    saved = _saved_plan(common, dirs)
    current = state.plan.params if state is not None else {}
    per_rank = [read_parameter_states(directory / plain.ZERO_DIR) for directory in dirs]
    scalars = per_rank[0][1] if with_states else {}
    local: dict[str, dict[str, torch.Tensor]] = {}
    for name, kinds in per_rank[0][0].items():
        saved_pp = saved.params.get(name) if saved is not None else None
        pp = current.get(name)
        for kind in kinds:
            shards = [states[name][kind] for states, _ in per_rank]
            whole = dstp.merge_shards(shards, saved_pp) if saved_pp is not None and saved_pp.sharded else shards[0]
            local.setdefault(name, {})[kind] = dstp.shard_tensor(whole, pp, tp_rank, tp_size) if pp is not None \
                else whole
    try:
        load_parameter_states(parts.optimizer, local, scalars, load_optimizer_states=with_states)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"{dirs[0].parent}: {exc}") from None


# ---------------------------------------------------------------------------------------------- 16-bit
def save_16bit_model(parts: TrainingParts, save_dir, save_filename: str, *,
                     exclude_frozen_parameters: bool = False) -> bool:
    """The whole (uncut) model in its training dtype, written by global rank 0: every tensor-parallel
    shard gathered over the tensor group and merged by the plan, so the file loads into the HF class."""
    state = tensor_state(parts)
    module = parts.module
    if plain._parameters_in_shards(parts) and not parts.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
        warnings.warn("save_16bit_model at ZeRO stage 3 needs zero_optimization."
                      "stage3_gather_16bit_weights_on_model_save: true; nothing saved", stacklevel=3)
        return False
    left_out = set(plain._frozen_names(module)) if exclude_frozen_parameters else set()
    group = state.tensor_group.group
    whole: dict[str, torch.Tensor] = {}
    with dszero.GatheredParameters(list(module.parameters())):
        for name, value in module.state_dict().items():
            if name in left_out:
                continue
            pp = state.plan.params.get(name)
            if pp is not None and pp.sharded:
                shards = [torch.empty_like(value) for _ in range(state.tp_size)]
                torch.distributed.all_gather(shards, value.detach().contiguous(), group=group)
                value = dstp.merge_shards(shards, pp)
            whole[name] = value.detach().clone()
    target = Path(save_dir) / save_filename
    if dscomm.get_rank() == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix in (".bin", ".pt", ".pth"):
            torch.save(whole, target)  # the format Hugging Face's from_pretrained reads
        else:
            dsaio.save(whole, target)
    dscomm.barrier(group=_world_group(parts))
    return True


MAX_TP_SIZE = 1 << 16


def saved_tp_size(common: dict, path: Path | None = None) -> int:
    """The autotp_size a checkpoint was saved at (1 without tensor parallelism); a value that is not a
    plausible degree is refused (the common file is read from disk and may be crafted)."""
    size = common.get(TP_SIZE, 1)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_TP_SIZE:
        raise CheckpointLoadError(f"{path or 'checkpoint'}: {TP_SIZE} = {size!r} is not a tensor-parallel degree "
                                  f"(1..{MAX_TP_SIZE})")
    return size


def is_tp_checkpoint(common: dict) -> bool:
    return saved_tp_size(common) > 1


