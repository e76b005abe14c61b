"""The parts of a run that a checkpoint holds, in the order they load (the module before ZeRO's
masters, which the weights then follow), and the order a checkpoint is read whole in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .module_weights import ModuleWeights
from .optimizer_state import OptimizerState
from .training_state import ClientState, Progress, RankState, SchedulerState, StepHookStates

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts
    from .layout import RunLayout
    from .protocol import CheckpointPart


def checkpoint_parts(parts: TrainingParts, layout: RunLayout, *, client_state: dict | None = None,
                     exclude_frozen: bool = False) -> list[CheckpointPart]:
    zero = parts.optimizer
    return [ModuleWeights(layout, partitioned=zero is not None and zero.partitions_parameters,
                          exclude_frozen=exclude_frozen),
            OptimizerState(zero, layout), SchedulerState(parts.lr_scheduler), StepHookStates(parts.step_hooks),
            ClientState(client_state),
            Progress(parts.progress, parts.config.gradient_accumulation_steps), RankState(parts.training_dataloader, layout)]


# Reading whole: ZeRO's state first, since at stage 3 the module's trained weights are its masters.
READ_ORDER: tuple[type[CheckpointPart], ...] = (OptimizerState, ModuleWeights, SchedulerState, StepHookStates,
                                                 ClientState, Progress, RankState)
