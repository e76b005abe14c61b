"""dsdata's wiring: data efficiency (curriculum learning, random-LTD) composed into training.

- compose step 3 (`apply_random_ltd`): random-LTD's reserved-length schedule, and the legacy
  top-level `curriculum_learning` (seqlen), which passes `curriculum_seqlen` to the model's forward
  as DeepSpeed's engine did; both advance as step hooks after each optimizer step;
- the parts' training loader (`curriculum_loader`): with curriculum learning on, `initialize(
  training_data=...)` returns a loader driven by dsdata's DataSampler, checkpointed with the engine;
- the engine's DeepSpeed methods `set_data_post_process_func`, `set_custom_curriculum_learning_schedule`
  and `random_ltd_initialize` (called by `dstrain.convert_to_random_ltd(engine, LayerClass)`).

As in DeepSpeed, each technique runs from its own `enabled` key (curriculum_learning.enabled,
random_ltd.enabled); where the enclosing data_efficiency / data_sampling / data_routing switches say
otherwise, a warning says so.
"""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING, Any

import torch

from dsconfig import ConfigError, ConfigWarning, DeepSpeedConfig, Problem

from ..errors import DstrainError
from .optional_libs import LazyLibrary, imported, require

if TYPE_CHECKING:
    from .compose import Composed

# dsdata is optional: imported on the first path that uses it (a data-efficiency key the gate let through).
dsdata = LazyLibrary("dsdata", "data efficiency (curriculum learning, random-LTD)")

# DeepSpeed's public random-LTD helpers, as dstrain names (dstrain.convert_to_random_ltd(engine, Layer)).
_DSDATA_NAMES = ("convert_to_random_ltd", "remove_random_ltd_state_dict", "save_without_random_ltd")


def __getattr__(name: str):
    if name in _DSDATA_NAMES:
        return getattr(require("dsdata", f"dstrain.{name}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

LTD_KEY = "data_efficiency.data_routing.random_ltd"
CURRICULUM_KEY = "data_efficiency.data_sampling.curriculum_learning"
LEGACY_KEY = "curriculum_learning"
CONSUMED_TOKENS = "Train/Samples/consumed_tokens"
CONSUMED_LAYER_TOKENS = "Train/Samples/consumed_layer_tokens"
RESERVED_LENGTH = "Train/Samples/random_ltd_reserved_length"
EFFECTIVE_SEQ_LENGTH = "Train/Samples/effective_seq_length"
CURRICULUM_SEQLEN = "Train/Samples/curriculum_seqlen"


class RandomLTDStep:
    """Step hook: after each optimizer step, count its layer tokens and move to the next reserved length."""

    name = "random_ltd"

    def __init__(self, scheduler: dsdata.RandomLTDScheduler, section: Any):
        self.scheduler = scheduler
        self.section = section  # the config's random_ltd section, for random_ltd_initialize()
        self.configured = False

    def __call__(self, global_steps: int) -> list[tuple[str, float]]:
        if not self.configured:
            self.configured = True  # warned once
            warnings.warn(f"{LTD_KEY}.enabled is true but no layer of the model drops tokens: call "
                          f"dstrain.convert_to_random_ltd(engine, YourLayerClass) after initialize()", stacklevel=2)
        scheduler = self.scheduler
        scheduler.step_completed(global_steps)
        return [(CONSUMED_TOKENS, scheduler.state["consumed_tokens"]),
                (CONSUMED_LAYER_TOKENS, scheduler.state["consumed_layer_tokens"]),
                (RESERVED_LENGTH, scheduler.get_current_seq()),
                (EFFECTIVE_SEQ_LENGTH, scheduler.effective_seq_length())]

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


class LegacySeqlenCurriculum:
    """DeepSpeed's legacy seqlen curriculum: the model's forward gets curriculum_seqlen=<difficulty> in
    training; after each optimizer step the difficulty moves to the schedule's value for the next step."""

    name = "legacy_curriculum"

    def __init__(self, scheduler: dsdata.CurriculumScheduler, global_batch_size: int, count_tokens: bool):
        self.scheduler = scheduler
        self.global_batch_size = global_batch_size
        self.count_tokens = count_tokens  # random-LTD counts them itself, at the length its layers see
        self.consumed_tokens = 0
        scheduler.update_difficulty(1)  # DeepSpeed: the forward of global step g uses the difficulty of g + 1

    def inject(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not module.training:
            return None
        kwargs.setdefault("curriculum_seqlen", self.scheduler.get_current_difficulty())
        return args, kwargs

    def __call__(self, global_steps: int) -> list[tuple[str, float]]:
        seqlen = self.scheduler.get_current_difficulty()
        self.consumed_tokens += self.global_batch_size * seqlen  # the step just finished ran at this length
        self.scheduler.update_difficulty(global_steps + 1)
        events = [(CURRICULUM_SEQLEN, self.scheduler.get_current_difficulty())]
        return [*events, (CONSUMED_TOKENS, self.consumed_tokens)] if self.count_tokens else events

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.get_state(), "consumed_tokens": self.consumed_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.set_state(state["scheduler"])
        self.consumed_tokens = int(state["consumed_tokens"])


# ---------------------------------------------------------------------------------------------- compose
def apply_random_ltd(composed: Composed, config: DeepSpeedConfig, groups: Any) -> Composed:
    """Compose step 3: random-LTD's schedule (layers wrapped before initialize() get it now; the usual
    convert_to_random_ltd(engine, ...) after initialize() does it then) and the legacy seqlen curriculum."""
    ltd = config.data_efficiency.data_routing.random_ltd
    legacy = config.curriculum_learning
    if not (ltd.enabled or legacy.enabled):
        return composed
    _refuse_pipeline(config, groups, ltd.enabled, legacy.enabled)
    if ltd.enabled:
        de = config.data_efficiency
        if not (de.enabled and de.data_routing.enabled):
            warnings.warn(f"{LTD_KEY}.enabled is true while data_efficiency.enabled or data_efficiency.data_routing."
                          f"enabled is false: random-LTD runs, as in DeepSpeed, which reads only its own key; set "
                          f"them true to say so, or turn random-LTD off", ConfigWarning, stacklevel=3)
        step = RandomLTDStep(_wrap(lambda: dsdata.RandomLTDScheduler(ltd, global_batch_size=config.train_batch_size),
                                   LTD_KEY), ltd)
        if dsdata.random_ltd_layers(composed.model):
            _wrap(lambda: dsdata.configure_random_ltd(composed.model, ltd, step.scheduler), LTD_KEY)
            step.configured = True
        composed.step_hooks.append(step)
    if legacy.enabled:
        _check_forward_takes_curriculum_seqlen(composed.model)
        scheduler = _wrap(lambda: dsdata.CurriculumScheduler(legacy, where=LEGACY_KEY), LEGACY_KEY)
        curriculum = LegacySeqlenCurriculum(scheduler, config.train_batch_size, count_tokens=not ltd.enabled)
        composed.model.register_forward_pre_hook(curriculum.inject, with_kwargs=True)
        composed.step_hooks.append(curriculum)
    return composed


def _refuse_pipeline(config: DeepSpeedConfig, groups: Any, ltd: bool, legacy: bool) -> None:
    stages = groups.size("pipe") if groups is not None else 1
    if stages > 1:
        key = f"{LTD_KEY}.enabled" if ltd else f"{LEGACY_KEY}.enabled"
        raise DstrainError(f"{key}: random-LTD and the legacy seqlen curriculum act on the whole model's layers and "
                           f"forward, which a pipeline of {stages} stages splits; they are not supported with "
                           f"pipeline parallelism (pipeline.stages > 1): turn one of them off")


def _check_forward_takes_curriculum_seqlen(model: torch.nn.Module) -> None:
    parameters = inspect.signature(model.forward).parameters.values()
    if not any(p.name == "curriculum_seqlen" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise ConfigError(Problem(f"{LEGACY_KEY}.curriculum_type", f"the legacy seqlen curriculum passes "
                                  f"curriculum_seqlen=<current length> to the model's forward, and "
                                  f"{type(model).__name__}.forward does not take it: add a curriculum_seqlen=None "
                                  f"keyword (cut the sequence to it when given), or use data_efficiency's curriculum "
                                  f"with engine.set_data_post_process_func", "seqlen"))


def _wrap(build, key: str):
    """dsdata's error as a ConfigError naming the config key."""
    try:
        return build()
    except dsdata.DataEfficiencyError as exc:
        raise ConfigError(Problem(key, str(exc))) from None


# ---------------------------------------------------------------------------------------------- the loader
def curriculum_loader(config: DeepSpeedConfig, training_data: Any, *, collate_fn: Any, dp_rank: int,
                      dp_world_size: int, data_parallel_group: Any, global_rank: int) -> Any:
    """The training loader driven by dsdata's DataSampler when curriculum learning is on (None otherwise)."""
    de = config.data_efficiency
    if not de.data_sampling.curriculum_learning.enabled:
        return None
    if not (de.enabled and de.data_sampling.enabled):
        warnings.warn(f"{CURRICULUM_KEY}.enabled is true while data_efficiency.enabled or data_efficiency."
                      f"data_sampling.enabled is false: the curriculum sampler runs, as in DeepSpeed, which reads only "
                      f"its own key; set them true to say so, or turn curriculum learning off", ConfigWarning,
                      stacklevel=4)
    sampler = _wrap(lambda: dsdata.DataSampler(
        de, len(training_data), config.train_micro_batch_size_per_gpu, dp_rank, dp_world_size,
        data_parallel_group=data_parallel_group, gradient_accumulation_steps=config.gradient_accumulation_steps,
        global_rank=global_rank, drop_last=config.dataloader_drop_last), CURRICULUM_KEY)
    return dsdata.SampledDataLoader(training_data, sampler, collate_fn=collate_fn,
                                    num_workers=de.data_sampling.num_workers)


def warn_curriculum_without_data(config: DeepSpeedConfig, training_data: Any) -> None:
    if config.data_efficiency.data_sampling.curriculum_learning.enabled and training_data is None:
        warnings.warn(f"{CURRICULUM_KEY}.enabled is true but initialize() got no training_data: the curriculum "
                      f"samples the loader initialize() builds from it, so no curriculum is applied", ConfigWarning,
                      stacklevel=4)


# ---------------------------------------------------------------------------------------------- engine methods
def set_data_post_process_func(parts: Any, post_process_func: Any) -> None:
    loader = parts.training_dataloader
    if post_process_func is not None and not callable(post_process_func):
        raise TypeError(f"set_data_post_process_func needs fn(batch, sampler_state) -> batch, got "
                        f"{type(post_process_func).__name__}")
    if not _is_curriculum_loader(loader):
        warnings.warn(f"set_data_post_process_func: the function runs on the curriculum loader ({CURRICULUM_KEY}."
                      f"enabled with initialize(training_data=...)); this engine's loader is "
                      f"{type(loader).__name__ if loader is not None else 'absent'}, so it is not applied",
                      stacklevel=3)
        return
    loader.post_process_func = post_process_func


def set_custom_curriculum_learning_schedule(parts: Any, schedule_func_dict: dict) -> None:
    """{metric: fn(global_step) -> difficulty} for the curriculum metrics with schedule_type "custom";
    the legacy curriculum's function under its curriculum_type ("seqlen")."""
    if not isinstance(schedule_func_dict, dict):
        raise TypeError(f"set_custom_curriculum_learning_schedule needs a dict {{metric name: fn(step)}}, got "
                        f"{type(schedule_func_dict).__name__}")
    remaining = dict(schedule_func_dict)
    legacy = next((h for h in parts.step_hooks if isinstance(h, LegacySeqlenCurriculum)), None)
    legacy_name = parts.config.curriculum_learning.curriculum_type
    if legacy is not None and legacy_name in remaining:
        legacy.scheduler.set_custom_get_difficulty(remaining.pop(legacy_name))
        legacy.scheduler.update_difficulty(parts.progress.global_steps + 1)
    loader = parts.training_dataloader
    if remaining and _is_curriculum_loader(loader):
        try:
            loader.set_custom_curriculum_learning_schedule(remaining)
        except dsdata.DataEfficiencyError as exc:
            raise DstrainError(str(exc)) from None
    elif remaining:
        raise DstrainError(f"set_custom_curriculum_learning_schedule: no curriculum runs for "
                           f"{', '.join(map(repr, remaining))}: it needs {CURRICULUM_KEY}.enabled with "
                           f"initialize(training_data=...) (or the legacy {LEGACY_KEY} section, under its "
                           f"curriculum_type)")


def _is_curriculum_loader(loader: Any) -> bool:
    return imported("dsdata") and isinstance(loader, dsdata.SampledDataLoader)  # without dsdata none is


def random_ltd_scheduler(parts: Any) -> dsdata.RandomLTDScheduler | None:
    step = next((h for h in parts.step_hooks if isinstance(h, RandomLTDStep)), None)
    return step.scheduler if step is not None else None


def random_ltd_initialize(parts: Any, module: torch.nn.Module) -> None:
    """Give the module's RandomLayerTokenDrop layers the run's schedule, matched by layer index."""
    step = next((h for h in parts.step_hooks if isinstance(h, RandomLTDStep)), None)
    if step is None:
        raise DstrainError(f"random_ltd_initialize: random-LTD is off in this run's config; set {LTD_KEY}.enabled "
                           f"(with its total_layer_num, random_ltd_layer_id, ... ) to drop tokens")
    _wrap(lambda: dsdata.configure_random_ltd(module, step.section, step.scheduler), LTD_KEY)
    step.configured = True

