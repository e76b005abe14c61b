"""`RandomLTDScheduler`: how many tokens each random-LTD layer keeps at a step, and the layer tokens
the run consumed.

The reserved length follows DeepSpeed's fixed_linear schedule from min_value to max_value over
require_steps, a multiple of seq_per_step, never below min_value (DeepSpeed's rounding can start
below it). Layer tokens count what the layers really ran on: a random-LTD layer min(reserved,
sequence) tokens per sample, every other layer the whole sequence, with the sequence length the
layers saw (a seqlen curriculum shortens it), where DeepSpeed always counts max_value.
"""

from __future__ import annotations

from typing import Any

from ..curriculum_scheduler import config_as_dict
from ..errors import DataEfficiencyError
from ..schedules import fixed_root

BASE = "data_efficiency.data_routing.random_ltd"
CONSUMED_LAYER_TOKENS = "consumed_layer_tokens"
CONSUMED_TOKENS = "consumed_tokens"
CURRENT_STEP = "current_steps"
CURRENT_VALUE = "current_value"
MIN_VALUE = "min_value"
MAX_VALUE = "max_value"


def effective_seq_length(seq_length: int, reserved_length: int, total_layer_num: int, random_ltd_layer_num: int) -> int:
    """The average tokens per layer for one sample: what a step's compute scales with (the tutorial's
    effective sequence length when random-LTD and a seqlen curriculum compose)."""
    kept = min(reserved_length, seq_length)
    return (seq_length * (total_layer_num - random_ltd_layer_num) + kept * random_ltd_layer_num) // total_layer_num


def _positive(section: dict, key: str, where: str) -> int:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DataEfficiencyError(f"{where}.{key} must be a positive integer, got {value!r}")
    return value


class RandomLTDScheduler:
    """The reserved-length schedule of random-LTD and its accounting.

    `config`: the random_ltd section (dsconfig RandomLTDConfig or DeepSpeed's dict); `global_batch_size`
    (samples per optimizer step over all ranks) is taken from the config dict's "global_batch_size" when
    not given, as DeepSpeed's engine puts it there.
    """

    def __init__(self, config: Any, global_batch_size: int | None = None):
        section = config_as_dict(config)
        self.model_layer_num = _positive(section, "total_layer_num", BASE)
        layer_num = section.get("random_ltd_layer_num")
        if not isinstance(layer_num, int) or not 0 <= layer_num <= self.model_layer_num:
            raise DataEfficiencyError(f"{BASE}.random_ltd_layer_num must be an integer in 0..{self.model_layer_num} "
                                      f"(total_layer_num), got {layer_num!r}")
        self.random_ltd_layer_num = layer_num
        self.global_batch_size = global_batch_size if global_batch_size is not None \
            else section.get("global_batch_size")
        if not isinstance(self.global_batch_size, int) or self.global_batch_size < 1:
            raise DataEfficiencyError(f"RandomLTDScheduler needs the global batch size (samples per step), got "
                                      f"{self.global_batch_size!r}")
        schedule = config_as_dict(section.get("random_ltd_schedule") or {})
        where = f"{BASE}.random_ltd_schedule"
        if schedule.get("schedule_type", "fixed_linear") != "fixed_linear":
            raise DataEfficiencyError(f"{where}.schedule_type must be 'fixed_linear' (the one DeepSpeed defines), "
                                      f"got {schedule.get('schedule_type')!r}")
        self.min_value = _positive(schedule, MIN_VALUE, where)
        self.max_value = _positive(schedule, MAX_VALUE, where)
        if self.min_value > self.max_value:
            raise DataEfficiencyError(f"{where}.min_value ({self.min_value}) must not exceed max_value "
                                      f"({self.max_value})")
        schedule_config = config_as_dict(schedule.get("schedule_config") or {})
        self.require_steps = _positive(schedule_config, "require_steps", f"{where}.schedule_config")
        self.seq_per_step = _positive(schedule_config, "seq_per_step", f"{where}.schedule_config")
        self.observed_seq_length: int | None = None  # set by the first random-LTD layer each training forward
        self.sampled_indices: Any = None  # this forward's kept tokens, [layers, batch, reserved], shared by the layers
        self.state: dict[str, int] = {}
        self.reset_to_init()

    # ------------------------------------------------------------------ DeepSpeed's methods
    def reset_to_init(self) -> None:
        self.state = {MIN_VALUE: self.min_value, MAX_VALUE: self.max_value, CURRENT_VALUE: self.get_value(0),
                      CONSUMED_LAYER_TOKENS: 0, CONSUMED_TOKENS: 0, CURRENT_STEP: -1}

    def get_value(self, global_steps: int) -> int:
        """The reserved length at `global_steps` (pure)."""
        return fixed_root(global_steps, min_difficulty=self.min_value, max_difficulty=self.max_value,
                          total_curriculum_step=self.require_steps, difficulty_step=self.seq_per_step, root_degree=1)

    def get_current_seq(self) -> int:
        return self.state[CURRENT_VALUE]

    def set_current_seq(self, seq_length: int) -> None:
        self.state[CURRENT_VALUE] = seq_length

    def get_random_ltd_layer_num(self) -> int:
        return self.random_ltd_layer_num

    def get_state(self) -> dict:
        return dict(self.state)

    def set_state(self, state: dict) -> None:
        self.load_state_dict(state)

    def update_seq(self, global_steps: int) -> int:
        """DeepSpeed's call at the start of step `global_steps`: move to its reserved length and count the
        layer tokens that step will consume (once per step)."""
        if self.state[CURRENT_VALUE] < self.max_value:
            self.state[CURRENT_VALUE] = self.get_value(global_steps)
        if global_steps != self.state[CURRENT_STEP]:
            self._count(self.state[CURRENT_VALUE])
            self.state[CURRENT_STEP] = global_steps
        return self.state[CURRENT_VALUE]

    def get_total_layer_tokens(self, train_iters: int) -> int:
        """The layer tokens `train_iters` steps consume from the start, at the full sequence length (pure)."""
        total = 0
        for step in range(train_iters):
            total += self.global_batch_size * self.layer_tokens_per_sample(self.get_value(step), self.max_value)
        return total

    # ------------------------------------------------------------------ the engine's step hook
    def step_completed(self, global_steps: int) -> int:
        """After an optimizer step (`global_steps` counts it): count the finished step's tokens at the reserved
        length it ran with and the sequence length its layers saw, then move to the next step's length."""
        if self.state[CURRENT_STEP] != global_steps:
            self._count(self.state[CURRENT_VALUE])
            self.state[CURRENT_STEP] = global_steps
        if self.state[CURRENT_VALUE] < self.max_value:
            self.state[CURRENT_VALUE] = self.get_value(global_steps)
        return self.state[CURRENT_VALUE]

    def layer_tokens_per_sample(self, reserved_length: int, seq_length: int) -> int:
        dropped_layers = self.random_ltd_layer_num
        return min(reserved_length, seq_length) * dropped_layers + seq_length * (self.model_layer_num - dropped_layers)

    def effective_seq_length(self, seq_length: int | None = None) -> int:
        seq = seq_length if seq_length is not None else (self.observed_seq_length or self.max_value)
        return effective_seq_length(seq, self.state[CURRENT_VALUE], self.model_layer_num, self.random_ltd_layer_num)

    def _count(self, reserved_length: int) -> None:
        seq = self.observed_seq_length or self.max_value
        self.state[CONSUMED_LAYER_TOKENS] += self.global_batch_size * self.layer_tokens_per_sample(reserved_length, seq)
        self.state[CONSUMED_TOKENS] += self.global_batch_size * seq

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, int]:
        return dict(self.state)

    def load_state_dict(self, state_dict: dict) -> None:
        keys = (CONSUMED_LAYER_TOKENS, CURRENT_STEP, CURRENT_VALUE, MIN_VALUE, MAX_VALUE)
        bad = [k for k in keys if not isinstance(state_dict.get(k), int) or isinstance(state_dict.get(k), bool)]
        if bad:
            raise DataEfficiencyError(f"random-LTD state: {', '.join(bad)} missing or not integers (expected "
                                      f"{', '.join(keys)})")
        if (state_dict[MIN_VALUE], state_dict[MAX_VALUE]) != (self.min_value, self.max_value):
            raise DataEfficiencyError(f"random-LTD state was saved with min_value {state_dict[MIN_VALUE]} and max_value "
                                      f"{state_dict[MAX_VALUE]}; the config now says {self.min_value} and "
                                      f"{self.max_value}")
        self.state = {key: int(state_dict[key]) for key in keys}
        self.state[CONSUMED_TOKENS] = int(state_dict.get(CONSUMED_TOKENS, 0))
