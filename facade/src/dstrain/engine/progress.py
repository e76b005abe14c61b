"""Where training stands: optimizer steps, samples and micro-steps taken, and the gradient-accumulation
boundary between them. Plain Python, shared by every engine; checkpoints save `state_dict()`."""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointLoadError

_SAVED = ("global_steps", "global_samples", "micro_steps")


class TrainingProgress:
    """The counters of one training run.

    `global_steps` counts optimizer steps (boundaries, applied or skipped for an fp16 overflow),
    `global_samples` the samples they consumed over all data-parallel ranks, `micro_steps` every
    engine.step() call. The backwards since the last boundary, a boundary override and whether the
    last step was applied belong to the step in progress: a checkpoint holds no accumulated
    gradients, so `state_dict()` leaves them out.
    """

    __slots__ = ("backwards_since_step", "boundary_override", "global_samples", "global_steps", "last_step_applied",
                 "micro_steps")

    def __init__(self) -> None:
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.backwards_since_step = 0
        self.boundary_override: bool | None = None
        self.last_step_applied = False

    def is_boundary(self, accumulation_steps: int | None) -> bool:
        """Whether the next step updates the weights; `accumulation_steps` None: every step does."""
        if self.boundary_override is not None:
            return self.boundary_override
        return accumulation_steps is None or (self.micro_steps + 1) % accumulation_steps == 0

    def record_backward(self) -> None:
        self.backwards_since_step += 1

    def micro_batches_in_step(self) -> int:
        """Backwards accumulated into the coming step (at least one: a step without backward still counts)."""
        return max(self.backwards_since_step, 1)

    def count_step(self, boundary: bool, samples: int) -> None:
        """One engine.step(): at a boundary, one optimizer step over `samples` samples."""
        self.micro_steps += 1
        if boundary:
            self.global_steps += 1
            self.global_samples += samples
            self.backwards_since_step = 0

    def state_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _SAVED}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        bad = [name for name in _SAVED if not isinstance(state.get(name), int) or isinstance(state[name], bool)
               or state[name] < 0]
        if bad:
            raise CheckpointLoadError(f"training progress: {', '.join(bad)} missing or not a non-negative integer "
                                      f"(got {', '.join(repr(state.get(n)) for n in bad)}); expected {list(_SAVED)}")
        for name in _SAVED:
            setattr(self, name, int(state[name]))
        self.backwards_since_step = 0
        self.boundary_override = None
        self.last_step_applied = False

    def __repr__(self) -> str:
        return (f"TrainingProgress(global_steps={self.global_steps}, global_samples={self.global_samples}, "
                f"micro_steps={self.micro_steps})")
