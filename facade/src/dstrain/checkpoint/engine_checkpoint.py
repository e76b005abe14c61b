"""Training checkpoints: `save_dir/<tag>/` holds the ZeRO shards (dszero), the module's weights
and buffers, and each rank's state (progress counters, loader position, RNG states), all as dsaio
files. The functions take the training parts (`parts.TrainingParts`), so the plain and the pipeline
training loops save alike.

A save is written to `<tag>.partial` and swapped into place only when every rank has written, and
`latest` is updated after that, so a crash mid-save leaves the previous checkpoint and `latest` as
they were. Every file is listed in a checksummed `manifest.json` (dszero's), checked before anything
is loaded, and nothing is ever unpickled: client state is refused at save time unless dsaio's
declared types can hold it.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

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
from ..wiring.autoep import load_autoep_optimizer, whole_state_dict
from ..wiring.dsmoe import expert_state_names, load_expert_states, save_expert_states
from . import rng
from .paths import LATEST, check_tag, read_latest, tag_directory

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts

ZERO_DIR = "zero"
MODEL_FILE = "model_states.safetensors"
COMMON_FILE = "engine_common.safetensors"  # scheduler and client state, written once
EXCLUDED_FROZEN = "excluded_frozen"  # in the common file, only when exclude_frozen_parameters left some out
STEP_HOOKS = "step_hooks"  # in the common file: {hook name: state} of the composition's stateful step hooks


def engine_file(rank: int) -> str:
    return f"engine_rank{rank:05d}.safetensors"


# ---------------------------------------------------------------------------------------------- save
def save_checkpoint(parts: TrainingParts, save_dir, tag: Any, client_state: dict, save_latest: bool, *,
                    exclude_frozen_parameters: bool = False) -> bool:
    if parts.optimizer is None:
        raise DstrainError("save_checkpoint() needs an optimizer: a checkpoint is the training state")
    from . import tp_checkpoint

    if tp_checkpoint.tensor_state(parts) is not None:  # one sub-directory per tensor rank
        return tp_checkpoint.save_checkpoint(parts, save_dir, tag, client_state, save_latest,
                                             exclude_frozen_parameters=exclude_frozen_parameters)
    # Everything a save can refuse is refused here, on every rank, before any rank writes or waits.
    steps = parts.progress.global_steps
    tag = check_tag(str(tag) if tag is not None else f"global_step{steps}")
    common = {"lr_scheduler": parts.lr_scheduler.state_dict() if parts.lr_scheduler is not None else None,
              "client_state": client_state, "dp_world_size": parts.dp_world_size,
              "zero_stage": parts.config.zero_optimization.stage, "global_steps": steps}
    excluded = _frozen_names(parts.module) if exclude_frozen_parameters else []
    if excluded:
        common[EXCLUDED_FROZEN] = excluded
    hook_states = {hook.name: hook.state_dict() for hook in _stateful_hooks(parts)}
    if hook_states:  # schedules that advance with the steps (random-LTD, a curriculum): the same on every rank
        common[STEP_HOOKS] = hook_states
    _check_storable(common)
    tag = _validate_tag(parts, tag)
    root = Path(save_dir)
    final = root / tag
    partial = root / f"{tag}.partial"
    if final.is_dir() and any(final.iterdir()) and not (final / COMMON_FILE).is_file():
        raise DstrainError(f"{final} exists and is not a dstrain checkpoint ({COMMON_FILE} missing); a save replaces "
                           f"its tag's directory, so it refuses to replace this one: choose another tag")
    group = parts.data_parallel_group
    node_local = parts.config.checkpoint.use_node_local_storage
    writer = is_shared_file_writer(root, group, node_local)
    if writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=group)
    parts.optimizer.save(partial / ZERO_DIR, node_local=node_local)
    dsaio.save_state_dict(_rank_state(parts), partial / engine_file(parts.dp_rank))
    save_expert_states(parts.module, partial)  # one file per (MoE layer, global expert), any ep_size loads
    if writer:
        dsaio.save_state_dict(_module_state(parts, set(excluded)), partial / MODEL_FILE)
        dsaio.save_state_dict(common, partial / COMMON_FILE)
    dscomm.barrier(group=group)
    if writer:
        write_manifest(partial)
        swap_into_place(partial, final)
        if save_latest:
            write_text_atomically(root / LATEST, tag)
    dscomm.barrier(group=group)
    log_on_rank0(parts.global_rank, f"saved checkpoint {final}")
    return True


def _check_storable(common: dict) -> None:
    # client_state and the scheduler's state_dict are the caller's objects: only declared types are stored.
    try:
        dsaio.check_state_dict(common)
    except TypeError as exc:
        raise DstrainError(f"save_checkpoint: {exc}; nothing was saved") from None


def _validate_tag(parts: TrainingParts, tag: str) -> str:
    """The tag every rank saves under: Fail refuses differing tags, Warn warns and takes rank 0's."""
    mode = parts.config.checkpoint.tag_validation
    if mode == "Ignore" or parts.dp_world_size == 1:
        return tag
    group = parts.data_parallel_group
    digest = int.from_bytes(hashlib.sha1(tag.encode()).digest()[:7], "little")
    low = torch.tensor([digest], dtype=torch.int64)
    high = low.clone()
    dscomm.all_reduce(low, op=dscomm.ReduceOp.MIN, group=group, log_name="checkpoint_tag")
    dscomm.all_reduce(high, op=dscomm.ReduceOp.MAX, group=group, log_name="checkpoint_tag")
    if low.item() == high.item():
        return tag
    message = (f"checkpoint tag {tag!r} on rank {parts.global_rank} differs from another rank's tag; every rank must "
               f"save under the same tag (checkpoint.tag_validation is {mode})")
    if mode == "Fail":
        raise DstrainError(message)
    warnings.warn(message + "; saving under rank 0's tag", stacklevel=4)
    return _rank0_text(tag, group)


def _rank0_text(text: str, group) -> str:
    encoded = torch.tensor(list(text.encode()), dtype=torch.uint8)
    length = torch.tensor([encoded.numel()], dtype=torch.int64)
    src = torch.distributed.get_global_rank(group, 0)
    dscomm.broadcast(length, src, group=group, log_name="checkpoint_tag")
    buffer = torch.zeros(int(length.item()), dtype=torch.uint8)
    buffer[: min(encoded.numel(), buffer.numel())] = encoded[: buffer.numel()]
    dscomm.broadcast(buffer, src, group=group, log_name="checkpoint_tag")
    return bytes(buffer.tolist()).decode()


def _stateful_hooks(parts: TrainingParts) -> list:
    return [hook for hook in parts.step_hooks if hasattr(hook, "state_dict") and hasattr(hook, "name")]


def _rank_state(parts: TrainingParts) -> dict[str, Any]:
    loader = parts.training_dataloader
    return {**parts.progress.state_dict(), "dp_world_size": parts.dp_world_size,
            "loader": loader.state_dict() if loader is not None else None, "rng": rng.capture()}


def _parameters_in_shards(parts: TrainingParts) -> bool:
    return parts.optimizer is not None and parts.optimizer.partitions_parameters


def _frozen_names(module: torch.nn.Module) -> list[str]:
    """Every state_dict key of a parameter with requires_grad False (each name of a shared one)."""
    return sorted(name for name, param in module.named_parameters(remove_duplicate=False) if not param.requires_grad)


def _sharded_names(parts: TrainingParts) -> set[str]:
    """The parameters the module file leaves to the ZeRO shards: at stage 3, the trained ones (ZeRO
    partitions what it updates; frozen parameters stay whole in the module and in its file)."""
    if not _parameters_in_shards(parts):
        return set()
    return {name for name, param in parts.module.named_parameters(remove_duplicate=False) if param.requires_grad}


def _module_state(parts: TrainingParts, excluded: set[str]) -> dict[str, torch.Tensor]:
    left_out = _sharded_names(parts) | excluded | expert_state_names(parts.module)
    return {k: v.detach().contiguous() for k, v in parts.module.state_dict().items() if k not in left_out}


def _load_common(path: Path) -> dict:
    common = dsaio.load_state_dict(path)
    expected = {"lr_scheduler", "client_state", "dp_world_size", "zero_stage", "global_steps"}
    if not isinstance(common, dict) or not expected <= set(common):
        raise CheckpointLoadError(f"{path}: not a dstrain engine file (expected the keys {sorted(expected)})")
    excluded = common.get(EXCLUDED_FROZEN, [])
    if not isinstance(excluded, list) or not all(isinstance(name, str) for name in excluded):
        raise CheckpointLoadError(f"{path}: {EXCLUDED_FROZEN} must be a list of parameter names, got "
                                  f"{type(excluded).__name__}")
    return common


# ---------------------------------------------------------------------------------------------- load
def load_checkpoint(parts: TrainingParts, load_dir, tag: Any, *, load_module_strict: bool,
                    load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool,
                    custom_load_fn: Callable[..., Any] | None = None) -> tuple[str | None, Any]:
    root = Path(load_dir)
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            warnings.warn(f"no '{LATEST}' file in {root}: nothing loaded (pass tag= to load a given checkpoint)",
                          stacklevel=3)
            return None, None
    else:
        tag = _checked_load_tag(str(tag))
    path = _checkpoint_path(root, tag)
    try:
        verify_manifest(path)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"cannot load checkpoint: {exc}") from None
    common = _load_common(path / COMMON_FILE)
    if custom_load_fn is not None and not callable(custom_load_fn):
        raise TypeError(f"load_checkpoint(custom_load_fn=...) must be callable as custom_load_fn(src=<state dict>, "
                        f"dst=<module>), got {type(custom_load_fn).__name__}")
    from . import tp_checkpoint

    if tp_checkpoint.tensor_state(parts) is not None or tp_checkpoint.is_tp_checkpoint(common):
        if custom_load_fn is not None:
            raise DstrainError("load_checkpoint(custom_load_fn=...) with tensor parallelism: the saved module is cut "
                               "over the tensor ranks; load without custom_load_fn")
        return tp_checkpoint.load_checkpoint(parts, path, common, load_module_strict=load_module_strict,
                                             load_optimizer_states=load_optimizer_states,
                                             load_lr_scheduler_states=load_lr_scheduler_states,
                                             load_module_only=load_module_only)
    if custom_load_fn is not None:
        _custom_load_module(parts, path, custom_load_fn)
    else:
        _load_module(parts, path, common, load_module_strict)
    optimizer = parts.optimizer
    if load_module_only or optimizer is None:
        # The weights just loaded become the masters; at stage 3 a custom load already wrote them through.
        if optimizer is not None and not (custom_load_fn is not None and _parameters_in_shards(parts)):
            _masters_from(parts, path)
        dscomm.barrier(group=parts.data_parallel_group)
        return str(path), common["client_state"]
    if not load_autoep_optimizer(optimizer, parts.module, path / ZERO_DIR, common["dp_world_size"],
                                 parts.dp_world_size, load_optimizer_states):  # AutoEP experts at another layout
        optimizer.load(path / ZERO_DIR, load_optimizer_states=load_optimizer_states)
    if load_lr_scheduler_states and parts.lr_scheduler is not None and common["lr_scheduler"] is not None:
        parts.lr_scheduler.load_state_dict(common["lr_scheduler"])
    saved_hooks = common.get(STEP_HOOKS) or {}
    for hook in _stateful_hooks(parts):
        if hook.name in saved_hooks:
            hook.load_state_dict(saved_hooks[hook.name])
    _load_rank_state(parts, path, common)
    dscomm.barrier(group=parts.data_parallel_group)
    log_on_rank0(parts.global_rank, f"loaded checkpoint {path} (step {parts.progress.global_steps})")
    return str(path), common["client_state"]


def _checked_load_tag(tag: str) -> str:
    try:
        return check_tag(tag)
    except DstrainError as exc:
        raise CheckpointLoadError(str(exc)) from None


def _checkpoint_path(root: Path, tag: str) -> Path:
    path = tag_directory(root, tag)
    if (path / COMMON_FILE).is_file():
        return path
    old = tag_directory(root, f"{tag}.old")
    if (old / COMMON_FILE).is_file():  # a re-save of this tag was interrupted mid-swap
        return old
    tags = sorted(p.name for p in root.iterdir() if (p / COMMON_FILE).is_file()) if root.is_dir() else []
    if (root / f"{tag}.partial").exists():
        reason = f"the save of {tag!r} did not finish (only {tag}.partial is there)"
    elif path.exists():
        reason = f"{path} is not a dstrain checkpoint ({COMMON_FILE} missing)"
    else:
        reason = f"{path} does not exist"
    raise CheckpointLoadError(f"cannot load checkpoint: {reason}; complete checkpoints in {root}: "
                              f"{', '.join(tags) or 'none'}")


def _load_module(parts: TrainingParts, path: Path, common: dict, strict: bool) -> None:
    saved = dsaio.load_state_dict(path / MODEL_FILE)
    current = parts.module.state_dict()
    # What the file should hold: everything but the shards' parameters and those the save excluded as frozen.
    expected = set(current) - _sharded_names(parts) - set(common.get(EXCLUDED_FROZEN) or [])
    expected -= expert_state_names(parts.module)  # in the per-expert files
    missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
    if strict and (missing or unexpected):
        raise CheckpointLoadError(f"{path / MODEL_FILE} does not match the model: missing {missing[:5]}"
                                  f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                                  f"{'...' if len(unexpected) > 5 else ''} (load_module_strict=False loads the "
                                  f"keys that match)")
    with torch.no_grad():
        for name, value in saved.items():
            if name in current:
                if current[name].shape != value.shape:
                    raise CheckpointLoadError(f"{path / MODEL_FILE}: {name} has shape {tuple(value.shape)} in the "
                                              f"checkpoint but {tuple(current[name].shape)} in the model")
                current[name].copy_(value)
    load_expert_states(parts.module, path, strict)


def _custom_load_module(parts: TrainingParts, path: Path, load_fn: Callable[..., Any]) -> None:
    """DeepSpeed's custom_load_fn(src=<the saved module state>, dst=<the module>), in place of the
    module's own loading. At stage 3 `src` also holds the trained parameters, in fp32 from the ZeRO
    shards, and the function runs with the parameters gathered; the first data-parallel rank's result
    is kept on every rank."""
    src = dsaio.load_state_dict(path / MODEL_FILE)
    if _parameters_in_shards(parts):
        src = {**dszero.get_fp32_state_dict_from_zero_checkpoint(path / ZERO_DIR), **src}
    with dszero.GatheredParameters(list(parts.module.parameters()), modifier_rank=0):
        load_fn(src=src, dst=parts.module)


def _masters_from(parts: TrainingParts, path: Path) -> None:
    """The ZeRO master weights after a module-only load."""
    if _parameters_in_shards(parts):
        parts.optimizer.load(path / ZERO_DIR, load_optimizer_states=False)
    else:
        parts.optimizer.masters_from_module()  # the module's weights, just loaded, are the truth


def _load_rank_state(parts: TrainingParts, path: Path, common: dict) -> None:
    same_world = common["dp_world_size"] == parts.dp_world_size
    state = dsaio.load_state_dict(path / engine_file(parts.dp_rank if same_world else 0))
    parts.progress.load_state_dict(state)
    loader = parts.training_dataloader
    if loader is not None and state["loader"] is not None:
        position = dict(state["loader"])
        if not same_world and "batches_taken" in position:  # the same samples consumed, in the new world's batches
            consumed = position["batches_taken"] * common["dp_world_size"]
            position["batches_taken"] = consumed // parts.dp_world_size
        loader.load_state_dict(position)
    if same_world:
        rng.restore(state["rng"])


# ---------------------------------------------------------------------------------------------- 16-bit
def save_16bit_model(parts: TrainingParts, save_dir, save_filename: str, *,
                     exclude_frozen_parameters: bool = False) -> bool:
    """The module's weights in its training dtype, as one file on rank 0 (torch format for .bin/.pt,
    safetensors otherwise); exclude_frozen_parameters leaves out those with requires_grad False. At
    stage 3 this needs stage3_gather_16bit_weights_on_model_save."""
    from . import tp_checkpoint

    if tp_checkpoint.tensor_state(parts) is not None:  # the shards merged: the whole model, loadable by its class
        return tp_checkpoint.save_16bit_model(parts, save_dir, save_filename,
                                              exclude_frozen_parameters=exclude_frozen_parameters)
    module = parts.module
    rank = parts.dp_rank
    target = Path(save_dir) / save_filename
    if _parameters_in_shards(parts) and not parts.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
        warnings.warn("save_16bit_model at ZeRO stage 3 needs zero_optimization."
                      "stage3_gather_16bit_weights_on_model_save: true; nothing saved", stacklevel=3)
        return False
    left_out = set(_frozen_names(module)) if exclude_frozen_parameters else set()
    with dszero.GatheredParameters(list(module.parameters())):  # stages 0-2: the parameters pass through
        whole = whole_state_dict(module, module.state_dict())  # AutoEP's experts gathered whole (every rank)
        state = {k: v.detach().clone() for k, v in whole.items() if k not in left_out} if rank == 0 else None
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix in (".bin", ".pt", ".pth"):
            torch.save(state, target)  # the format Hugging Face's from_pretrained reads
        else:
            dsaio.save(state, target)
    dscomm.barrier(group=parts.data_parallel_group)
    return True
