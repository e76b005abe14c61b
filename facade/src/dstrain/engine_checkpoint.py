"""The engine's checkpoints: `save_dir/<tag>/` holds the ZeRO shards (dszero), the module's weights
and buffers, and each rank's engine state (step counters, loader position, RNG states), all as
dsaio files. A save is written to `<tag>.partial` and swapped into place only when every rank has
written, and `latest` is updated after that, so a crash mid-save leaves the previous checkpoint and
`latest` as they were. Every file is listed in a checksummed `manifest.json` (dszero's), checked
before anything is loaded, and nothing is ever unpickled: client state is refused at save time
unless dsaio's declared types can hold it.
"""

from __future__ import annotations

import hashlib
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
    swap_into_place,
    verify_manifest,
    write_manifest,
    write_text_atomically,
)

from . import rng
from .checkpoint_paths import LATEST, check_tag, read_latest, tag_directory
from .errors import CheckpointLoadError, DstrainError
from .logs import log_on_rank0

if TYPE_CHECKING:
    from .engine import DeepSpeedEngine

ZERO_DIR = "zero"
MODEL_FILE = "model_states.safetensors"
COMMON_FILE = "engine_common.safetensors"  # scheduler and client state, written once


def engine_file(rank: int) -> str:
    return f"engine_rank{rank:05d}.safetensors"


# ---------------------------------------------------------------------------------------------- save
def save_checkpoint(engine: DeepSpeedEngine, save_dir, tag: Any, client_state: dict, save_latest: bool) -> bool:
    engine._require_optimizer("save_checkpoint")
    # Everything a save can refuse is refused here, on every rank, before any rank writes or waits.
    tag = check_tag(str(tag) if tag is not None else f"global_step{engine.global_steps}")
    common = {"lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
              "client_state": client_state, "dp_world_size": engine.dp_world_size,
              "zero_stage": engine.zero_optimization_stage(), "global_steps": engine.global_steps}
    _check_storable(common)
    tag = _validate_tag(engine, tag)
    root = Path(save_dir)
    final = root / tag
    partial = root / f"{tag}.partial"
    if final.is_dir() and any(final.iterdir()) and not (final / COMMON_FILE).is_file():
        raise DstrainError(f"{final} exists and is not a dstrain checkpoint ({COMMON_FILE} missing); a save replaces "
                           f"its tag's directory, so it refuses to replace this one: choose another tag")
    group = engine.data_parallel_group
    writer = is_shared_file_writer(root, group, engine._config.checkpoint.use_node_local_storage)
    if writer:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dscomm.barrier(group=group)
    engine.optimizer.save(partial / ZERO_DIR, node_local=engine._config.checkpoint.use_node_local_storage)
    dp_rank = torch.distributed.get_rank(group)
    dsaio.save_state_dict(_rank_state(engine), partial / engine_file(dp_rank))
    if writer:
        dsaio.save_state_dict(_module_state(engine), partial / MODEL_FILE)
        dsaio.save_state_dict(common, partial / COMMON_FILE)
    dscomm.barrier(group=group)
    if writer:
        write_manifest(partial)
        swap_into_place(partial, final)
        if save_latest:
            write_text_atomically(root / LATEST, tag)
    dscomm.barrier(group=group)
    log_on_rank0(engine.global_rank, f"saved checkpoint {final}")
    return True


def _check_storable(common: dict) -> None:
    # client_state and the scheduler's state_dict are the caller's objects: only declared types are stored.
    try:
        dsaio.check_state_dict(common)
    except TypeError as exc:
        raise DstrainError(f"save_checkpoint: {exc}; nothing was saved") from None


def _validate_tag(engine: DeepSpeedEngine, tag: str) -> str:
    """The tag every rank saves under: Fail refuses differing tags, Warn warns and takes rank 0's."""
    mode = engine._config.checkpoint.tag_validation
    if mode == "Ignore" or engine.dp_world_size == 1:
        return tag
    group = engine.data_parallel_group
    digest = int.from_bytes(hashlib.sha1(tag.encode()).digest()[:7], "little")
    low = torch.tensor([digest], dtype=torch.int64)
    high = low.clone()
    dscomm.all_reduce(low, op=dscomm.ReduceOp.MIN, group=group, log_name="checkpoint_tag")
    dscomm.all_reduce(high, op=dscomm.ReduceOp.MAX, group=group, log_name="checkpoint_tag")
    if low.item() == high.item():
        return tag
    message = (f"checkpoint tag {tag!r} on rank {engine.global_rank} differs from another rank's tag; every rank must "
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


def _rank_state(engine: DeepSpeedEngine) -> dict[str, Any]:
    loader = engine.training_dataloader
    return {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "micro_steps": engine.micro_steps, "dp_world_size": engine.dp_world_size,
            "loader": loader.state_dict() if loader is not None else None, "rng": rng.capture()}


def _parameters_in_shards(engine: DeepSpeedEngine) -> bool:
    return engine.optimizer is not None and engine.optimizer.partitions_parameters


def _module_state(engine: DeepSpeedEngine) -> dict[str, torch.Tensor]:
    # Where the parameters live only in the ZeRO shards (stage 3), the module file keeps its buffers.
    module = engine.module
    if _parameters_in_shards(engine):
        param_names = {name for name, _ in module.named_parameters()}
        state = {k: v for k, v in module.state_dict().items() if k not in param_names}
    else:
        state = module.state_dict()
    return {k: v.detach().contiguous() for k, v in state.items()}


def _load_common(path: Path) -> dict:
    common = dsaio.load_state_dict(path)
    expected = {"lr_scheduler", "client_state", "dp_world_size", "zero_stage", "global_steps"}
    if not isinstance(common, dict) or not expected <= set(common):
        raise CheckpointLoadError(f"{path}: not a dstrain engine file (expected the keys {sorted(expected)})")
    return common


# ---------------------------------------------------------------------------------------------- load
def load_checkpoint(engine: DeepSpeedEngine, load_dir, tag: Any, *, load_module_strict: bool,
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
        tag = _checked_load_tag(str(tag))
    path = _checkpoint_path(root, tag)
    try:
        verify_manifest(path)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"cannot load checkpoint: {exc}") from None
    common = _load_common(path / COMMON_FILE)
    _load_module(engine, path, load_module_strict)
    if load_module_only or engine.optimizer is None:
        if engine.optimizer is not None:
            _masters_from(engine, path)
        dscomm.barrier(group=engine.data_parallel_group)
        return str(path), common["client_state"]
    engine.optimizer.load(path / ZERO_DIR, load_optimizer_states=load_optimizer_states)
    if load_lr_scheduler_states and engine.lr_scheduler is not None and common["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(common["lr_scheduler"])
    _load_rank_state(engine, path, common)
    dscomm.barrier(group=engine.data_parallel_group)
    log_on_rank0(engine.global_rank, f"loaded checkpoint {path} (step {engine.global_steps})")
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


def _load_module(engine: DeepSpeedEngine, path: Path, strict: bool) -> None:
    saved = dsaio.load_state_dict(path / MODEL_FILE)
    module = engine.module
    current = module.state_dict()
    if _parameters_in_shards(engine):
        param_names = {name for name, _ in module.named_parameters()}
        expected = {k for k in current if k not in param_names}
    else:
        expected = set(current)
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


def _masters_from(engine: DeepSpeedEngine, path: Path) -> None:
    """The ZeRO master weights after a module-only load."""
    if _parameters_in_shards(engine):
        engine.optimizer.load(path / ZERO_DIR, load_optimizer_states=False)
    else:
        engine.optimizer.masters_from_module()  # the module's weights, just loaded, are the truth


def _load_rank_state(engine: DeepSpeedEngine, path: Path, common: dict) -> None:
    dp_rank = torch.distributed.get_rank(engine.data_parallel_group)
    same_world = common["dp_world_size"] == engine.dp_world_size
    state = dsaio.load_state_dict(path / engine_file(dp_rank if same_world else 0))
    engine.global_steps = int(state["global_steps"])
    engine.global_samples = int(state["global_samples"])
    engine.micro_steps = int(state["micro_steps"])
    loader = engine.training_dataloader
    if loader is not None and state["loader"] is not None:
        position = dict(state["loader"])
        if not same_world:  # the same number of samples consumed, in batches of the new world size
            consumed = position["batches_taken"] * common["dp_world_size"]
            position["batches_taken"] = consumed // engine.dp_world_size
        loader.load_state_dict(position)
    if same_world:
        rng.restore(state["rng"])


# ---------------------------------------------------------------------------------------------- 16-bit
def save_16bit_model(engine: DeepSpeedEngine, save_dir, save_filename: str) -> bool:
    """The module's weights in its training dtype, as one file on rank 0 (torch format for .bin/.pt,
    safetensors otherwise). At stage 3 this needs stage3_gather_16bit_weights_on_model_save."""
    module = engine.module
    rank = torch.distributed.get_rank(engine.data_parallel_group)
    target = Path(save_dir) / save_filename
    if _parameters_in_shards(engine):
        if not engine._config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
            warnings.warn("save_16bit_model at ZeRO stage 3 needs zero_optimization."
                          "stage3_gather_16bit_weights_on_model_save: true; nothing saved", stacklevel=3)
            return False
        with dszero.GatheredParameters(list(module.parameters())):
            state = {k: v.detach().clone() for k, v in module.state_dict().items()} if rank == 0 else None
    else:
        state = {k: v.detach().clone() for k, v in module.state_dict().items()} if rank == 0 else None
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix in (".bin", ".pt", ".pth"):
            torch.save(state, target)  # the format Hugging Face's from_pretrained reads
        else:
            dsaio.save(state, target)
    dscomm.barrier(group=engine.data_parallel_group)
    return True
