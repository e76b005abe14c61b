"""Domino's communication hiding for any model: the batch runs as two halves that take turns.

`HalfBatchOverlap.run(fn, first, second)` runs fn on each half of the batch as a coroutine
(greenlet) on the calling thread. A half runs until it reaches a tensor-parallel collective: it
issues the all-reduce asynchronously and hands over (`hand_over()`), so the other half computes
while the sum is in flight, then waits for it when its turn comes back. The order of turns is fixed,
so every rank issues the same collectives in the same order. Backward interleaves the same way:
each half also hands over right after creating the node that will wait for its input-gradient
all-reduce, so in the autograd graph the other half's work sits between the all-reduce and its wait.

Running on one thread (not two) keeps torch's per-thread state (grad mode, autocast) shared and
the autograd sequence numbers interleaved as the halves ran. Context managers entered by the model
itself around a hand-over point (activation checkpointing's saved-tensor hooks) would see both
halves, so the engine refuses overlap with activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import greenlet
import torch

from .errors import TensorParallelError


class HalfBatchOverlap:
    def __init__(self) -> None:
        self._halves: tuple[Any, ...] = ()

    def running(self) -> bool:
        return bool(self._halves) and greenlet.getcurrent() in self._halves

    def current_half(self) -> Any:
        return greenlet.getcurrent() if self.running() else None

    def hand_over(self) -> None:
        """Give the turn to the other half (no-op outside run())."""
        if self.running():
            greenlet.getcurrent().parent.switch()

    def run(self, fn: Callable[..., Any], first: tuple[tuple, dict], second: tuple[tuple, dict]) -> tuple[Any, Any]:
        """(fn(*first), fn(*second)), interleaved at each hand-over."""
        if self._halves:
            raise TensorParallelError("tp_overlap_comm: a half-batch run started inside another one (the overlapped "
                                      "module is nested in itself)")
        results: list[Any] = [None, None]

        def runner(index: int, args: tuple, kwargs: dict) -> Callable[[], None]:
            def body() -> None:
                results[index] = fn(*args, **kwargs)
            return body

        halves = (greenlet.greenlet(runner(0, *first)), greenlet.greenlet(runner(1, *second)))
        self._halves = halves
        try:
            turn = 0
            while not all(h.dead for h in halves):
                if not halves[turn].dead:
                    halves[turn].switch()
                turn = 1 - turn
        except BaseException:
            for half in halves:
                if not half.dead:
                    half.throw(greenlet.GreenletExit)
            raise
        finally:
            self._halves = ()
        return results[0], results[1]


# ---------------------------------------------------------------------------------------------- batch halves
def batch_size(args: tuple, kwargs: dict) -> int | None:
    """The batch size of a call: dim 0 of its first tensor argument with two or more dimensions."""
    for value in (*args, *kwargs.values()):
        if torch.is_tensor(value) and value.dim() >= 2:
            return int(value.shape[0])
    return None


def split_batch(value: Any, batch: int) -> tuple[Any, Any]:
    """Two halves of `value` along dim 0: tensors of two or more dimensions whose dim 0 is the batch
    are cut; everything else (1-D positions, broadcast masks, flags) goes to both halves whole."""
    if torch.is_tensor(value) and value.dim() >= 2 and value.shape[0] == batch:
        first = (batch + 1) // 2
        return value[:first], value[first:]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        pairs = [split_batch(v, batch) for v in value]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if isinstance(value, dict):
        pairs = {k: split_batch(v, batch) for k, v in value.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(value, list):
        pairs = [split_batch(v, batch) for v in value]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return value, value


def merge_batch(first: Any, second: Any) -> Any:
    """The outputs of the two halves as one output of the whole batch."""
    if torch.is_tensor(first):
        if first.dim() >= 1 and torch.is_tensor(second) and first.shape[1:] == second.shape[1:]:
            return torch.cat([first, second], dim=0)
        raise TensorParallelError(f"tp_overlap_comm: cannot join the halves' outputs of shapes {tuple(first.shape)} "
                                  f"and {tuple(second.shape)}")
    if first is None:
        return None
    if isinstance(first, dict):  # ModelOutput is a dict subclass that takes its fields as keywords
        merged = {key: merge_batch(first[key], second[key]) for key in first}
        return type(first)(**merged)
    if isinstance(first, (tuple, list)):
        return type(first)(merge_batch(a, b) for a, b in zip(first, second, strict=True))
    if isinstance(first, (int, float, bool, str)) and first == second:
        return first
    raise TensorParallelError(f"tp_overlap_comm: cannot join the halves' outputs of type {type(first).__name__}; "
                              f"turn tp_overlap_comm off for this model")
