"""`CurriculumScheduler`: DeepSpeed's object around one pacing function, with its methods and state."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import attrs

from .errors import DataEfficiencyError
from .schedules import make_schedule

MIN_DIFFICULTY = "min_difficulty"
MAX_DIFFICULTY = "max_difficulty"
CURRENT_DIFFICULTY = "current_difficulty"
SCHEDULE_TYPE = "schedule_type"
SCHEDULE_CONFIG = "schedule_config"


def config_as_dict(config: Any) -> dict:
    """A curriculum section as DeepSpeed's plain dict: a dict as given, or a dsconfig section (attrs),
    whose unset (None) schedule keys are left out."""
    if isinstance(config, dict):
        return config
    if attrs.has(type(config)):
        return attrs.asdict(config, filter=lambda _, value: value is not None)
    raise DataEfficiencyError(f"a curriculum config must be a dict or a dsconfig section, got {type(config).__name__}")


class CurriculumScheduler:
    """The difficulty schedule of one curriculum metric (or of the legacy seqlen curriculum).

    `config`: {"min_difficulty", "max_difficulty", "schedule_type", "schedule_config": {...}} as in
    the DeepSpeed config, or the dsconfig section holding them. The current difficulty starts at
    min_difficulty; `update_difficulty(step)` moves it along the schedule until it reaches
    max_difficulty, where it stays.
    """

    def __init__(self, config: Any, *, where: str = "curriculum_learning"):
        config = config_as_dict(config)
        missing = [key for key in (MIN_DIFFICULTY, MAX_DIFFICULTY, SCHEDULE_TYPE) if config.get(key) is None]
        if missing:
            raise DataEfficiencyError(f"{where}: curriculum learning needs {', '.join(missing)}")
        schedule_config = dict(config.get(SCHEDULE_CONFIG) or {})
        self._where = where
        self._schedule = make_schedule(config[SCHEDULE_TYPE], min_difficulty=config[MIN_DIFFICULTY],
                                       max_difficulty=config[MAX_DIFFICULTY], schedule_config=schedule_config,
                                       where=f"{where}.schedule_config")
        self.custom_get_difficulty: Callable[[int], int] | None = None
        self.state = {MIN_DIFFICULTY: config[MIN_DIFFICULTY], MAX_DIFFICULTY: config[MAX_DIFFICULTY],
                      CURRENT_DIFFICULTY: config[MIN_DIFFICULTY], SCHEDULE_TYPE: config[SCHEDULE_TYPE],
                      SCHEDULE_CONFIG: schedule_config}

    # ------------------------------------------------------------------ DeepSpeed's methods
    def get_current_difficulty(self) -> int:
        return self.state[CURRENT_DIFFICULTY]

    def set_current_difficulty(self, difficulty: int) -> None:
        self.state[CURRENT_DIFFICULTY] = difficulty

    def set_custom_get_difficulty(self, schedule_function: Callable[[int], int]) -> None:
        """The pacing function of schedule_type "custom": called with the global step, returns the difficulty."""
        if not callable(schedule_function):
            raise DataEfficiencyError(f"{self._where}: the custom schedule must be callable as fn(global_step) -> "
                                      f"difficulty, got {type(schedule_function).__name__}")
        self.custom_get_difficulty = schedule_function

    def get_state(self) -> dict:
        return copy.deepcopy(self.state)

    def set_state(self, state: dict) -> None:
        missing = {MIN_DIFFICULTY, MAX_DIFFICULTY, CURRENT_DIFFICULTY, SCHEDULE_TYPE} - set(state)
        if missing:
            raise DataEfficiencyError(f"{self._where}: a curriculum scheduler state needs {sorted(missing)}")
        self.state = copy.deepcopy(state)

    def get_difficulty(self, global_steps: int) -> int:
        """The schedule's difficulty at `global_steps` (pure: the current difficulty is not changed)."""
        if self._schedule is not None:
            return self._schedule(global_steps)
        if self.custom_get_difficulty is None:
            raise DataEfficiencyError(f"{self._where}: schedule_type 'custom' needs its pacing function: call "
                                      f"engine.set_custom_curriculum_learning_schedule({{metric: fn}}) (or "
                                      f"set_custom_get_difficulty(fn)) before training")
        return self.custom_get_difficulty(global_steps)

    def update_difficulty(self, global_steps: int) -> int:
        """Move the current difficulty to the schedule's value at `global_steps`, unless it already reached
        max_difficulty; returns the current difficulty."""
        if self.state[CURRENT_DIFFICULTY] < self.state[MAX_DIFFICULTY]:
            self.state[CURRENT_DIFFICULTY] = self.get_difficulty(global_steps)
        return self.state[CURRENT_DIFFICULTY]
