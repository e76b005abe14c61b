"""Launch gradient reductions in one fixed order, whatever order gradients arrive in.

Collectives must be issued in the same order on every rank. Gradients can become ready in a
different order on different ranks (or some not at all), so work items (stage-2 buckets, stage-3
units) are launched strictly in their fixed order, each once all its members are ready, as DDP
does; whatever is left when backward ends is launched then, missing gradients counting as zeros.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch


class InOrderLauncher:
    def __init__(self, sizes: list[int], launch: Callable[[int], None], on_end: Callable[[], None]):
        self.sizes = sizes              # members per item
        self.launch = launch            # launch(item index)
        self.on_end = on_end            # after the last item of a backward pass
        self.ready: list[set[int]] = [set() for _ in sizes]
        self.next = 0
        self.callback_queued = False

    def mark_ready(self, item: int, member: int) -> None:
        """Called from a gradient hook: `member` of `item` has its gradient."""
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self.ready[item].add(member)
        while self.next < len(self.sizes) and len(self.ready[self.next]) >= self.sizes[self.next]:
            self._launch_next()

    def _launch_next(self) -> None:
        item = self.next
        self.ready[item].clear()
        self.next += 1
        self.launch(item)

    def _end_of_backward(self) -> None:
        while self.next < len(self.sizes):
            self._launch_next()
        self.next = 0
        self.callback_queued = False
        self.on_end()


def weakly(method: Callable) -> Callable:
    """A hook that calls a bound method without keeping its object alive.

    Gradient hooks live on the parameter tensors, where the garbage collector cannot follow them:
    a hook holding its reducer would keep the reducer, and through it the model, alive forever.
    """
    ref = weakref.WeakMethod(method)

    def hook(*args):
        bound = ref()
        if bound is not None:
            bound(*args)
    return hook
