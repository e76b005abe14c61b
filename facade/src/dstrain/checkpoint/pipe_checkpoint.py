"""Checkpoints of a pipeline (dspipe): the weights one file per layer, as DeepSpeed names them, so they
load at any number of stages; each stage's ZeRO shards and ranks' state in a sub-directory of its own.

    <tag>/engine_common.safetensors          scheduler, client state, the pipeline's shape
    <tag>/layer_XX-model_states.safetensors  layer XX's weights, written by data rank 0 of its stage
    <tag>/pipe_00_of_02/zero/                stage rank 0's ZeRO shards over its data group
    <tag>/pipe_00_of_02/engine_rankNNNNN...  each of its data ranks' counters, loader position, RNG
    <tag>/manifest.json                      every file above, checked before anything is loaded

The plain checkpoints' rules hold (engine_checkpoint.py, whose helpers this reuses): tags checked
before writing, a `.partial` directory swapped into place once every rank has written, `latest` after
that, dsaio files only. At the number of stages it was saved with everything loads; at another one
the weights load from the layer files and the optimizer's state cannot follow (its shards are cut by
stage): load_checkpoint says so unless load_optimizer_states=False, which starts the moments afresh.
"""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dsaio
import dscomm
import dszero
from dszero.checkpoint import (
    is_shared_file_writer,
    swap_into_place,
    verify_manifest,
    write_manifest,
    write_text_atomically,
)

from ..errors import CheckpointLoadError, DstrainError
from ..logs import log_on_rank0
from . import engine_checkpoint as plain
from .paths import LATEST, check_tag, read_latest

if TYPE_CHECKING:
    from dspipe import PipelineModule

    from ..engine.parts import TrainingParts

PIPELINE = "pipeline"  # in the common file: {"ranks", "stages", "shape", "boundaries"}


class DsaioFiles:
    """dspipe's checkpoint engine over dsaio's safetensors files (nothing is ever unpickled)."""

    suffix = ".safetensors"

    def save(self, state_dict: dict, path: Path) -> None:
        dsaio.save_state_dict(state_dict, path)

    def load(self, path: Path) -> dict:
        try:
            return dsaio.load_state_dict(path)
        except dsaio.CheckpointError as exc:
            raise CheckpointLoadError(f"{path}: {exc}") from None


def stage_directory(pipe_rank: int, ranks: int) -> str:
    return f"pipe_{pipe_rank:02d}_of_{ranks:02d}"


def _shape(module: PipelineModule) -> dict[str, Any]:
    layout = module.placement
    return {"ranks": layout.ranks, "stages": layout.stages, "shape": layout.shape, "boundaries": list(module.parts)}


def _world(parts: TrainingParts) -> Any:
    return parts.groups.world if parts.groups is not None else None


def _hooks(parts: TrainingParts) -> list:
    return [h for h in getattr(parts, "step_hooks", []) if hasattr(h, "state_dict") and hasattr(h, "name")]


# ---------------------------------------------------------------------------------------------- save
def save_checkpoint(parts: TrainingParts, module: PipelineModule, save_dir, tag: Any, client_state: dict,
                    save_latest: bool, *, exclude_frozen_parameters: bool = False) -> bool:
    steps = parts.progress.global_steps
    tag = check_tag(str(tag) if tag is not None else f"global_step{steps}")
    common = {"lr_scheduler": parts.lr_scheduler.state_dict() if parts.lr_scheduler is not None else None,
              "client_state": client_state, "dp_world_size": parts.dp_world_size,
              "zero_stage": parts.config.zero_optimization.stage, "global_steps": steps, PIPELINE: _shape(module)}
    hook_states = {hook.name: hook.state_dict() for hook in _hooks(parts)}
    if hook_states:
        common["step_hooks"] = hook_states
    plain._check_storable(common)
    world = _world(parts)
    # The tag must agree over every rank of every stage, not only within a data-parallel group.
    everyone = dataclasses.replace(parts, data_parallel_group=world, dp_world_size=dscomm.get_world_size())
    tag = plain._validate_tag(everyone, tag)
    root = Path(save_dir)
    final, partial = root / tag, root / f"{tag}.partial"
    if final.is_dir() and any(final.iterdir()) and not (final / plain.COMMON_FILE).is_file():
        raise DstrainError(f"{final} exists and is not a dstrain checkpoint ({plain.COMMON_FILE} missing); a save "
                           f"replaces its tag's directory, so it refuses to replace this one: choose another tag")
    node_local = parts.config.checkpoint.use_node_local_storage
    writer = is_shared_file_writer(root, world, node_local)
    if writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=world)
    mine = partial / stage_directory(module.stage_id, module.num_stages)
    if parts.dp_rank == 0:
        mine.mkdir(parents=True, exist_ok=True)
    dscomm.barrier(group=world)
    parts.optimizer.save(mine / plain.ZERO_DIR, node_local=node_local)  # over this stage's data group
    dsaio.save_state_dict(plain._rank_state(parts), mine / plain.engine_file(parts.dp_rank))
    module.save_state_dict(partial, DsaioFiles(), exclude_frozen_params=exclude_frozen_parameters)
    if writer:
        dsaio.save_state_dict(common, partial / plain.COMMON_FILE)
    dscomm.barrier(group=world)
    if writer:
        write_manifest(partial)
        swap_into_place(partial, final)
        if save_latest:
            write_text_atomically(root / LATEST, tag)
    dscomm.barrier(group=world)
    log_on_rank0(parts.global_rank, f"saved checkpoint {final} ({module.num_stages} pipeline ranks)")
    return True


# ---------------------------------------------------------------------------------------------- load
def load_checkpoint(parts: TrainingParts, module: PipelineModule, load_dir, tag: Any, *, load_module_strict: bool,
                    load_optimizer_states: bool, load_lr_scheduler_states: bool,
                    load_module_only: bool) -> tuple[str | None, Any]:
    root = Path(load_dir)
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            warnings.warn(f"no '{LATEST}' file in {root}: nothing loaded (pass tag= to load a given checkpoint)",
                          stacklevel=3)
            return None, None
    else:
        tag = plain._checked_load_tag(str(tag))
    path = plain._checkpoint_path(root, tag)
    try:
        verify_manifest(path)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"cannot load checkpoint: {exc}") from None
    common = plain._load_common(path / plain.COMMON_FILE)
    saved = common.get(PIPELINE)
    if not isinstance(saved, dict) or not isinstance(saved.get("ranks"), int):
        raise CheckpointLoadError(f"{path}: not a pipeline checkpoint (no '{PIPELINE}' entry in "
                                  f"{plain.COMMON_FILE}); a data-parallel engine saved it")
    same = saved == _shape(module)
    optimizer = parts.optimizer
    wants_state = optimizer is not None and not load_module_only and load_optimizer_states
    if wants_state and not same:
        raise CheckpointLoadError(
            f"{path} was saved by {saved['ranks']} pipeline ranks ({saved['stages']} stages, boundaries "
            f"{saved['boundaries']}); this run has {module.num_stages} ({module.placement.stages} stages, boundaries "
            f"{module.parts}). The weights load at any number of stages but the optimizer's state is cut by stage: "
            f"pass load_optimizer_states=False to load the weights, scheduler and counters and start the optimizer's "
            f"moments afresh")
    module.load_state_dir(path, DsaioFiles(), strict=load_module_strict)
    mine = path / stage_directory(module.stage_id, module.num_stages)
    if optimizer is not None:
        if same and not load_module_only:
            optimizer.load(mine / plain.ZERO_DIR, load_optimizer_states=load_optimizer_states)
        else:
            optimizer.masters_from_module()  # the weights just loaded are the truth
    if not load_module_only and optimizer is not None:
        if load_lr_scheduler_states and parts.lr_scheduler is not None and common["lr_scheduler"] is not None:
            parts.lr_scheduler.load_state_dict(common["lr_scheduler"])
        saved_hooks = common.get("step_hooks") or {}
        for hook in _hooks(parts):
            if hook.name in saved_hooks:
                hook.load_state_dict(saved_hooks[hook.name])
        stage_dir = mine if same else path / stage_directory(0, saved["ranks"])
        plain._load_rank_state(parts, stage_dir, common)
    dscomm.barrier(group=_world(parts))
    log_on_rank0(parts.global_rank, f"loaded checkpoint {path} (saved by {saved['ranks']} pipeline ranks, now "
                                    f"{module.num_stages}; step {parts.progress.global_steps})")
    return str(path), common["client_state"]
