"""The small parts of a run: the scheduler, the client's state, the step hooks (dsdata's curriculum and
random-LTD schedules), the progress counters, and each rank's loader position and RNG. They hold no
tensors a layout cuts: the first four are one copy for the whole run (the common file, or rank 0's
counters), so they load alike at any layout; a rank's loader position follows the samples consumed to
another data-parallel size, and its RNG comes back only where the same rank runs again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import CheckpointLoadError
from . import rng

if TYPE_CHECKING:
    from ..engine.progress import TrainingProgress
    from .contents import WholeCheckpoint
    from .layout import RunLayout
    from .protocol import LoadOptions, LoadSource, SaveTarget
    from .saved import SavedCheckpoint

STEP_HOOKS = "step_hooks"  # in the common file: {hook name: state}
PROGRESS = ("global_steps", "global_samples", "micro_steps")


class SchedulerState:
    holds_tensors: ClassVar[bool] = False

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def save(self, out: SaveTarget) -> None:
        out.common["lr_scheduler"] = self.scheduler.state_dict() if self.scheduler is not None else None

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        whole.lr_scheduler = saved.common["lr_scheduler"]

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        state = source.whole.lr_scheduler
        if options.module_only or not options.lr_scheduler_states or self.scheduler is None or state is None:
            return
        self.scheduler.load_state_dict(state)


class ClientState:
    """The client's dict: saved as given (dsaio's declared types only), handed back by load_checkpoint."""

    holds_tensors: ClassVar[bool] = False

    def __init__(self, client_state: dict | None = None):
        self.client_state = client_state

    def save(self, out: SaveTarget) -> None:
        out.common["client_state"] = self.client_state if self.client_state is not None else {}

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        whole.client_state = saved.common["client_state"]

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        pass  # returned to the caller


class StepHookStates:
    """The composition's stateful step hooks (an object with `name`, `state_dict` and `load_state_dict`):
    schedules that advance with the steps, the same on every rank."""

    holds_tensors: ClassVar[bool] = False

    def __init__(self, hooks: list):
        self.hooks = [hook for hook in hooks if hasattr(hook, "state_dict") and hasattr(hook, "name")]

    def save(self, out: SaveTarget) -> None:
        states = {hook.name: hook.state_dict() for hook in self.hooks}
        if states:
            out.common[STEP_HOOKS] = states

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        states = saved.common.get(STEP_HOOKS) or {}
        if not isinstance(states, dict) or not all(isinstance(name, str) for name in states):
            raise CheckpointLoadError(f"{saved.path}: {STEP_HOOKS} must map hook names to states")
        whole.step_hooks = dict(states)

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        if options.module_only:
            return
        for hook in self.hooks:
            if hook.name in source.whole.step_hooks:
                hook.load_state_dict(source.whole.step_hooks[hook.name])


class Progress:
    """global_steps, global_samples, micro_steps: the same on every rank (each rank's file holds them).
    micro_steps decides where the next accumulation boundary falls: one saved at another
    gradient_accumulation_steps (or mid-accumulation) restarts the accumulation, as global_steps x gas."""

    holds_tensors: ClassVar[bool] = False

    def __init__(self, progress: TrainingProgress, accumulation_steps: int):
        self.progress = progress
        self.accumulation_steps = max(int(accumulation_steps), 1)

    def save(self, out: SaveTarget) -> None:
        out.rank.update(self.progress.state_dict())

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        _, state = saved.rank_state(saved.first_directory(), 0)
        whole.progress.update({name: state[name] for name in PROGRESS if name in state})

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        if options.module_only:
            return
        state = {**self.progress.state_dict(),
                 **{name: source.whole.progress[name] for name in PROGRESS if name in source.whole.progress}}
        micro, steps = state["micro_steps"], state["global_steps"]
        if not isinstance(micro, int) or micro % self.accumulation_steps:
            state["micro_steps"] = steps * self.accumulation_steps if isinstance(steps, int) else micro
        self.progress.load_state_dict(state)


class RankState:
    """This rank's loader position and random generators: dstrain's own files only (no whole form)."""

    holds_tensors: ClassVar[bool] = False

    def __init__(self, loader: Any, layout: RunLayout):
        self.loader = loader
        self.layout = layout

    def save(self, out: SaveTarget) -> None:
        out.rank["loader"] = self.loader.state_dict() if self.loader is not None else None
        out.rank["rng"] = rng.capture()

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        pass  # a rank's position belongs to that rank, not to the checkpoint seen whole

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        saved = source.saved
        if options.module_only or saved is None:
            return
        same_world = source.same_layout and saved.layout.dp_size == self.layout.dp_size
        directory = saved.directory_of(self.layout.place()) if source.same_layout else saved.first_directory()
        read, state = saved.rank_state(directory, self.layout.dp_rank if same_world else 0)
        same_rank = same_world and read == self.layout.dp_rank
        if self.loader is not None and state.get("loader") is not None:
            position = dict(state["loader"])
            if saved.layout.dp_size != self.layout.dp_size and "batches_taken" in position:
                # the same samples consumed, in the new world's batches
                position["batches_taken"] = position["batches_taken"] * saved.layout.dp_size // self.layout.dp_size
            self.loader.load_state_dict(position)
        if same_rank:
            rng.restore(state["rng"])
