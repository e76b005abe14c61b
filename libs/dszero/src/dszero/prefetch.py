"""Which stage-3 units to gather ahead (`stage3_prefetch_bucket_size`); pure Python over unit keys.

The first forward + backward records the order in which units are needed (forward and backward
pre-hooks). On later steps, each need that matches the recording moves a cursor along it, and the
units needed next, up to the bucket size in elements (counting those already in flight, skipping
those already gathered), are gathered asynchronously while the current module computes.

Deadlock-free because every input to the choice (the recording, the cursor, which units are
gathered) follows from the sequence of needs, which is the same on every rank. A need that differs
from the recording (an eval forward's end, a model that changes its order) stops prefetching until
the next forward of the recording's first unit, or the next step; units are then gathered on demand.
"""

from __future__ import annotations

from collections.abc import Callable


class PrefetchPlan:
    def __init__(self, bucket_numel: int):
        self.bucket = bucket_numel
        self.trace: list[tuple[int, bool]] = []  # (unit key, in forward?), in need order
        self.numel: dict[int, int] = {}
        self.recording = True
        self.cursor = 0
        self.aligned = False

    def on_need(self, key: int, numel: int, forward: bool) -> None:
        """A unit is needed by a forward (or backward) pre-hook."""
        if self.recording:
            self.trace.append((key, forward))
            self.numel[key] = numel
        elif self.aligned and self.cursor < len(self.trace) and self.trace[self.cursor] == (key, forward):
            self.cursor += 1
        elif forward and self.trace and self.trace[0] == (key, True):
            self.cursor, self.aligned = 1, True  # a forward starts again (after an eval-only forward, say)
        else:
            self.aligned = False  # off the recording: gather on demand until it starts again

    def ahead(self, resident: Callable[[int], bool], budget: int | None = None) -> list[int]:
        """The next units to gather, in need order: at most `budget` (the bucket) elements not yet resident."""
        budget = self.bucket if budget is None else budget
        if self.recording or not self.aligned or budget <= 0:
            return []
        chosen: list[int] = []
        seen: set[int] = set()
        total = 0
        for key, _ in self.trace[self.cursor:]:
            if key in seen:
                continue
            seen.add(key)
            if resident(key):
                continue
            total += self.numel[key]
            if total > budget:
                break
            chosen.append(key)
        return chosen

    def end_of_step(self) -> None:
        """Backward ended; the first time, the recording is complete."""
        if self.recording and self.trace:
            self.recording = False
        self.cursor = 0
        self.aligned = not self.recording
