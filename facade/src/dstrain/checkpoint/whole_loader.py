"""Loading a `WholeCheckpoint` (each tensor whole, by name) into a run at its own layout.

STAND-IN: the checkpoint seam (issue 30, section 1) brings the one `load_whole(parts, whole, ...)`; until
it lands, DeepSpeed's checkpoints and the universal layout load through this one. It is kept to what
they need: the module's weights (cut for this tensor rank where the model is tensor-parallel; a
pipeline stage takes its own layers), the fp32 masters and optimizer moments cut into this rank's ZeRO
shards by dszero's `load_parameter_states` at any data-parallel size, the optimizer's group settings,
the loss scaler, the scheduler, the progress counters and the step hooks.

Everything is checked against the model before anything is written (names, shapes after cutting), so a
checkpoint that does not fit leaves the run as it was.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

import dscomm
import dszero
from dszero.checkpoint import load_parameter_states

from ..errors import CheckpointLoadError
from ..logs import log_on_rank0
from ..wiring.optional_libs import LazyLibrary, imported
from .contents import MASTER, WholeCheckpoint
from .deepspeed.experts import EXPERT_NAME

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts

dstp = LazyLibrary("dstp", "a tensor-parallel checkpoint")


def load_whole(parts: TrainingParts, whole: WholeCheckpoint, *, load_module_strict: bool,
               load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool,
               stage_of_pipeline: bool = False, group: Any = None) -> dict[str, Any]:
    """Apply `whole` to the run; returns its client state. `stage_of_pipeline`: the module is one
    pipeline stage (the checkpoint's other layers are not an error); `group`: the ranks to wait for."""
    cut = _tensor_cutter(parts)
    sharded = _sharded_names(parts)
    # What ZeRO trains takes its weights from the masters below: the module's copies are not read for it.
    through_masters = {slot.name for group in parts.optimizer.groups for slot in group.layout.slots} \
        if parts.optimizer is not None else set()
    module_values = _module_values(parts, whole, cut, sharded, load_module_strict, stage_of_pipeline)
    states = _parameter_states(parts, whole, cut) if parts.optimizer is not None else {}
    restore_run = not load_module_only and parts.optimizer is not None
    with torch.no_grad():
        targets = parts.module.state_dict(keep_vars=True)
        for name, value in module_values.items():
            if name not in through_masters:
                targets[name].data.copy_(value.to(targets[name].dtype))
    optimizer = parts.optimizer
    if optimizer is not None:
        with_states = load_optimizer_states and not load_module_only
        try:
            load_parameter_states(optimizer, states, whole.scalars if with_states else {},
                                  load_optimizer_states=with_states)
        except dszero.CheckpointError as exc:
            raise CheckpointLoadError(f"{whole.path}: {exc}") from None
        if with_states:
            _group_settings(optimizer, whole)
    if restore_run:
        _run_state(parts, whole, load_lr_scheduler_states)
    dscomm.barrier(group=group if group is not None else parts.data_parallel_group)
    log_on_rank0(parts.global_rank, f"loaded {whole.source} checkpoint {whole.path} "
                                    f"(step {parts.progress.global_steps})")
    return dict(whole.client_state)


def _tensor_cutter(parts: TrainingParts):
    """name, whole tensor -> this tensor rank's piece (the tensor itself without tensor parallelism)."""
    if not imported("dstp"):
        return lambda name, tensor: tensor
    state = dstp.state_of(parts.module)
    if state is None or state.tp_size <= 1:
        return lambda name, tensor: tensor
    plans, rank, size = state.plan.params, state.tp_rank, state.tp_size

    def cut(name: str, tensor: torch.Tensor) -> torch.Tensor:
        plan = plans.get(name)
        return dstp.shard_tensor(tensor, plan, rank, size) if plan is not None else tensor

    return cut


def _sharded_names(parts: TrainingParts) -> set[str]:
    """At stage 3 the trained parameters live in ZeRO's shards: they load through the masters."""
    if parts.optimizer is None or not parts.optimizer.partitions_parameters:
        return set()
    return {n for n, p in parts.module.named_parameters(remove_duplicate=False) if p.requires_grad}


def _module_values(parts: TrainingParts, whole: WholeCheckpoint, cut, sharded: set[str], strict: bool,
                   stage_of_pipeline: bool) -> dict[str, torch.Tensor]:
    targets = parts.module.state_dict(keep_vars=True)
    wanted = {n for n in targets if n not in sharded}
    missing = sorted(n for n in wanted | sharded if n not in whole.module and n not in whole.parameters)
    # A pipeline stage holds its own layers, an expert-parallel rank its own experts: the others are not extra.
    own_experts = {m["prefix"] for n in targets if (m := EXPERT_NAME.fullmatch(n))}
    unexpected = [] if stage_of_pipeline else sorted(
        n for n in set(whole.module) - set(targets)
        if not ((m := EXPERT_NAME.fullmatch(n)) and m["prefix"] in own_experts))
    if strict and (missing or unexpected):
        raise CheckpointLoadError(f"{whole.path} does not match the model: missing {missing[:5]}"
                                  f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                                  f"{'...' if len(unexpected) > 5 else ''} (load_module_strict=False loads the "
                                  f"entries that match)")
    values = {}
    for name in sorted(wanted):
        if name not in whole.module:
            continue
        value = cut(name, whole.module[name])
        if tuple(value.shape) != tuple(targets[name].shape):
            raise CheckpointLoadError(f"{whole.path}: {name} has shape {tuple(whole.module[name].shape)} in the "
                                      f"checkpoint, which does not fit the model's {tuple(targets[name].shape)}; "
                                      f"nothing was loaded")
        values[name] = value
    return values


def _parameter_states(parts: TrainingParts, whole: WholeCheckpoint, cut) -> dict[str, dict[str, torch.Tensor]]:
    """Each of this rank's ZeRO parameters' master and optimizer state, cut for this tensor rank and
    checked against the parameter's shape."""
    states: dict[str, dict[str, torch.Tensor]] = {}
    for group in parts.optimizer.groups:
        for slot in group.layout.slots:
            entry = whole.parameters.get(slot.name)
            if entry is None:
                if slot.name not in whole.module:
                    raise CheckpointLoadError(f"{whole.path}: parameter {slot.name} is not in the checkpoint; "
                                              f"nothing was loaded")
                entry = {MASTER: whole.module[slot.name].float()}  # frozen when saved: its weights are the truth
            kinds = {}
            for kind, tensor in entry.items():
                value = cut(slot.name, tensor)
                if tuple(value.shape) != tuple(slot.shape):
                    raise CheckpointLoadError(f"{whole.path}: parameter {slot.name} ({kind}) has shape "
                                              f"{tuple(tensor.shape)} in the checkpoint, which does not fit the "
                                              f"model's {tuple(slot.shape)}; nothing was loaded")
                kinds[kind] = value
            if MASTER not in kinds:
                raise CheckpointLoadError(f"{whole.path}: parameter {slot.name} has no fp32 master weights")
            states[slot.name] = kinds
    return states


def _group_settings(optimizer: Any, whole: WholeCheckpoint) -> None:
    """The saved groups' settings (the lr the next step takes, betas...): group by group where the groups
    correspond, or the one setting every saved group shares where this run groups its parameters otherwise
    (tensor parallelism keeps its cut parameters in groups of their own)."""
    saved = whole.optimizer_groups
    current = optimizer.param_groups
    if not saved:
        return
    if len(saved) != len(current):
        if any(group != saved[0] for group in saved[1:]):
            warnings.warn(f"{whole.path}: {len(saved)} optimizer parameter groups with different settings were "
                          f"saved and this run has {len(current)}; the groups' settings (lr, betas...) are this "
                          f"run's own", stacklevel=4)
            return
        saved = saved[:1] * len(current)
    for group, settings in zip(current, saved):
        for key, value in settings.items():
            if key in group and key != "params":
                group[key] = value


def _run_state(parts: TrainingParts, whole: WholeCheckpoint, load_lr_scheduler_states: bool) -> None:
    optimizer = parts.optimizer
    scaler_state = whole.loss_scaler
    if scaler_state is not None and bool(optimizer.scaler.dynamic) == ("steps" in scaler_state):
        optimizer.scaler.load_state_dict(scaler_state)
    optimizer.skipped_steps = int(whole.progress.get("skipped_steps", 0))
    if load_lr_scheduler_states and parts.lr_scheduler is not None and whole.lr_scheduler is not None:
        parts.lr_scheduler.load_state_dict(whole.lr_scheduler)
    steps = int(whole.progress.get("global_steps", 0))
    accumulation = parts.config.gradient_accumulation_steps or 1
    counters = {"global_steps": steps,
                "global_samples": int(whole.progress.get("global_samples", steps * parts.config.train_batch_size)),
                "micro_steps": int(whole.progress.get("micro_steps", steps * accumulation))}
    parts.progress.load_state_dict(counters)
    for hook in parts.step_hooks:
        name = getattr(hook, "name", None)
        if name in whole.step_hooks and hasattr(hook, "load_state_dict"):
            hook.load_state_dict(whole.step_hooks[name])
