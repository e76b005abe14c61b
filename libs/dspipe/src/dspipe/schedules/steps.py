"""DeepSpeed's step-wise pipeline schedules: `TrainSchedule`, `InferenceSchedule`, `DataParallelSchedule`.

Where the rest of this package describes a schedule as one `Action` list per rank, DeepSpeed's `PipeEngine`
model is one stage's view, step by step: iterating a schedule yields, per step, the list of instructions
that stage runs (`LoadMicroBatch(buffer_id=0)`, `ForwardPass(...)`, `SendActivation(...)`, ...). Each step is
atomic: a barrier between steps cannot deadlock. Scripts and tools written against
`deepspeed.runtime.pipe.schedule` iterate these; the sequences are DeepSpeed's.

    for step in TrainSchedule(micro_batches=4, stages=2, stage_id=0):
        ...   # e.g. [LoadMicroBatch(buffer_id=0), ForwardPass(buffer_id=0)]

TrainSchedule is synchronous 1F1B: at step `s`, stage `k` runs a forward pass when `s + k` is even, of
micro-batch `(s - k) // 2`, else the backward pass of micro-batch `(s + k + 1) // 2 - stages`; a step whose
micro-batch is outside `[0, micro_batches)` only communicates. Buffers are reused cyclically
(`num_pipe_buffers()`: the in-flight forwards of the stage, at least 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import ScheduleError


class PipeInstruction:
    """One instruction of a step; its keyword arguments are attributes (`instr.buffer_id`), as in DeepSpeed."""

    def __init__(self, **kwargs: Any):
        self.name = type(self).__name__
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.kwargs == self.kwargs  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.kwargs.items()))))


class OptimizerStep(PipeInstruction):
    """Step the optimizer (the last step of a batch)."""


class ReduceGrads(PipeInstruction):
    """Reduce the stage's gradients over its data-parallel group."""


class ReduceTiedGrads(PipeInstruction):
    """Reduce the gradients of tied modules over the stages that hold them."""


class BufferOpInstruction(PipeInstruction):
    """An instruction on one pipeline buffer, `buffer_id`."""

    def __init__(self, buffer_id: int, **kwargs: Any):
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """Load the next micro-batch into the buffer (first stage: inputs; last stage: labels)."""


class ForwardPass(BufferOpInstruction):
    """Forward the stage on the buffer's activations."""


class BackwardPass(BufferOpInstruction):
    """Backward the stage from the buffer's output gradients."""


class SendActivation(BufferOpInstruction):
    """Send the buffer's output activations to the next stage."""


class RecvActivation(BufferOpInstruction):
    """Receive input activations from the previous stage into the buffer."""


class SendGrad(BufferOpInstruction):
    """Send the gradients of the buffer's inputs to the previous stage."""


class RecvGrad(BufferOpInstruction):
    """Receive the gradients of the buffer's outputs from the next stage."""


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ScheduleError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


class PipeSchedule:
    """One stage's schedule: `steps()` yields each step's instructions; iterating the schedule runs `steps()`."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int):
        self.micro_batches = _count("micro_batches", micro_batches, 1)
        self.stages = _count("stages", stages, 1)
        self.stage_id = _count("stage_id", stage_id, 0)
        if stage_id >= stages:
            raise ScheduleError(f"stage_id {stage_id} is outside the pipeline's {stages} stages")
        self.prev_stage = stage_id - 1
        self.next_stage = stage_id + 1
        self.it: Iterator[list[PipeInstruction]] | None = None

    def steps(self) -> Iterator[list[PipeInstruction]]:
        raise NotImplementedError(f"{type(self).__name__} must define steps()")

    def num_pipe_buffers(self) -> int:
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id: int) -> bool:
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    def _buffer_idx(self, micro_batch_id: int) -> int:
        if not self._valid_micro_batch(micro_batch_id):
            raise ScheduleError(f"micro-batch {micro_batch_id} is outside [0, {self.micro_batches})")
        return micro_batch_id % self.num_pipe_buffers()

    @property
    def stage(self) -> int:
        return self.stage_id

    @property
    def num_stages(self) -> int:
        return self.stages

    @property
    def num_micro_batches(self) -> int:
        return self.micro_batches

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def __iter__(self) -> PipeSchedule:
        self.it = None
        return self

    def __next__(self) -> list[PipeInstruction]:
        if self.it is None:
            self.it = self.steps()
        return next(self.it)


class InferenceSchedule(PipeSchedule):
    """Forward passes only: micro-batch `s - k` at step `s` on stage `k`, through two alternating buffers."""

    def steps(self) -> Iterator[list[PipeInstruction]]:
        even_stage = self.stage_id % 2 == 0
        for step_id in range(self.micro_batches + self.stages - 1):
            micro_batch_id = step_id - self.stage_id
            current = self._valid_micro_batch(micro_batch_id)
            recv_buf = step_id % 2 if even_stage else (step_id + 1) % 2
            send_buf = 1 - recv_buf
            cmds: list[PipeInstruction] = []
            if (self.is_first_stage or self.is_last_stage) and current:
                cmds.append(LoadMicroBatch(recv_buf))
            send = [SendActivation(send_buf)] if (
                self._valid_stage(self.next_stage) and self._valid_micro_batch(micro_batch_id - 1)) else []
            recv = [RecvActivation(recv_buf)] if self._valid_stage(self.prev_stage) and current else []
            cmds += send + recv if even_stage else recv + send  # even stages send first: no send/recv deadlock
            if current:
                cmds.append(ForwardPass(recv_buf))
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 2


class TrainSchedule(PipeSchedule):
    """Synchronous 1F1B training: forwards and backwards interleaved, the optimizer stepped at the end."""

    def _step_to_micro_batch(self, step_id: int) -> tuple[int, bool]:
        if (step_id + self.stage_id) % 2 == 0:
            return (step_id - self.stage_id) // 2, True
        return (step_id + self.stage_id + 1) // 2 - self.stages, False

    def steps(self) -> Iterator[list[PipeInstruction]]:
        total_steps = 2 * (self.micro_batches + self.stages - 1)
        prev_micro_batch_id = -1
        for step_id in range(total_steps):
            micro_batch_id, is_forward = self._step_to_micro_batch(step_id)
            current = self._valid_micro_batch(micro_batch_id)
            previous = self._valid_micro_batch(prev_micro_batch_id)
            cmds: list[PipeInstruction] = []
            if is_forward:
                if previous and self._valid_stage(self.prev_stage):
                    cmds.append(SendGrad(self._buffer_idx(prev_micro_batch_id)))
                if current and self._valid_stage(self.prev_stage):
                    cmds.append(RecvActivation(self._buffer_idx(micro_batch_id)))
            else:
                if current and self._valid_stage(self.next_stage):
                    cmds.append(RecvGrad(self._buffer_idx(micro_batch_id)))
                if previous and self._valid_stage(self.next_stage):
                    cmds.append(SendActivation(self._buffer_idx(prev_micro_batch_id)))
            if (self.is_first_stage or self.is_last_stage) and is_forward and current:
                cmds.append(LoadMicroBatch(self._buffer_idx(micro_batch_id)))
            if current:
                pass_ = ForwardPass if is_forward else BackwardPass
                cmds.append(pass_(self._buffer_idx(micro_batch_id)))
            if step_id == total_steps - 1:
                cmds += [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]
            prev_micro_batch_id = micro_batch_id
            yield cmds

    def num_pipe_buffers(self) -> int:
        """The stage's in-flight forward passes (its distance to the last stage, at most the micro-batches), >= 2."""
        return max(2, min(self.stages - self.stage_id, self.micro_batches))


class DataParallelSchedule(PipeSchedule):
    """No pipeline: forward and backward each micro-batch in one buffer, reduce and step after the last."""

    def steps(self) -> Iterator[list[PipeInstruction]]:
        for step_id in range(self.micro_batches):
            cmds: list[PipeInstruction] = [LoadMicroBatch(buffer_id=0), ForwardPass(buffer_id=0),
                                           BackwardPass(buffer_id=0)]
            if step_id == self.micro_batches - 1:
                cmds += [ReduceGrads(), OptimizerStep()]
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 1


__all__ = ["BackwardPass", "BufferOpInstruction", "DataParallelSchedule", "ForwardPass", "InferenceSchedule",
           "LoadMicroBatch", "OptimizerStep", "PipeInstruction", "PipeSchedule", "RecvActivation", "RecvGrad",
           "ReduceGrads", "ReduceTiedGrads", "SendActivation", "SendGrad", "TrainSchedule"]
