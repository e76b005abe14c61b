"""Which stage-3 units to gather ahead (`stage3_prefetch_bucket_size`); pure Python over unit keys.

The first forward + backward records the order in which units are needed (forward and backward
pre-hooks). On later steps, each need that matches the recording moves a cursor along it, and the
units needed next are gathered asynchronously while the current module computes: chosen in need
order while the elements chosen and not yet needed (those already in flight included, those already
gathered not counted) stay under the bucket size. The unit that crosses the bucket is still chosen,
as DeepSpeed's coordinator admits parameters while its count is below the bucket: a unit larger than
the bucket (a layer's stacked experts) is prefetched too, never always gathered on demand. The caller
asks for them after every need (see `ahead`).

Deadlock-free because every input to the choice (the recording, the cursor, which units are
gathered) follows from the sequence of needs, which is the same on every rank. A need that differs
from the recording (an eval forward's end, a model that changes its order) stops prefetching until
the next forward of the recording's first unit, or the next step; units are then gathered on demand.
"""

from __future__ import annotations

from collections.abc import Callable

# What the caller says about a unit when the plan looks ahead.
ABSENT = 0  # not gathered: a candidate
BUSY = 1    # gathered but its forward is running: it may be released before its next need
KEPT = 2    # gathered and stays so until its next need (kept by reuse, or needed in backward)


class PrefetchPlan:
    def __init__(self, bucket_numel: int, on_miss: Callable[[int, bool], None] | None = None):
        self.bucket = bucket_numel
        self.on_miss = on_miss  # told (unit key, forward?) when the needs leave the recording (log_trace_cache_warnings)
        self.trace: list[tuple[int, bool]] = []  # (unit key, in forward?), in need order
        self.numel: dict[int, int] = {}
        self.recording = True
        self.cursor = 0
        self.aligned = False
        self.frontier = 0  # trace positions before it are decided for this pass
        self.in_flight: dict[int, int] = {}  # chosen, not yet needed -> elements

    def on_need(self, key: int, numel: int, forward: bool) -> None:
        """A unit is needed by a forward (or backward) pre-hook."""
        self.in_flight.pop(key, None)
        if self.recording:
            self.trace.append((key, forward))
            self.numel[key] = numel
        elif self.aligned and self.cursor < len(self.trace) and self.trace[self.cursor] == (key, forward):
            self.cursor += 1
        elif forward and self.trace and self.trace[0] == (key, True):
            self._restart(1)  # a forward starts again (after an eval-only forward, say)
        else:
            if self.aligned and self.on_miss is not None:
                self.on_miss(key, forward)
            self.aligned = False  # off the recording: gather on demand until it starts again
            self.in_flight.clear()

    def ahead(self, state: Callable[[int], int]) -> list[int]:
        """Units to gather now, in need order, while the elements chosen and not yet needed are under
        `bucket` (the last one chosen may cross it).

        The look-ahead moves on from where it stopped, so a step costs time linear in its needs: it
        passes units chosen or KEPT, and waits at a BUSY unit or a second need of one in flight.
        """
        if self.recording or not self.aligned or self.bucket <= 0:
            return []
        used = sum(self.in_flight.values())
        chosen: list[int] = []
        position = max(self.cursor, self.frontier)
        while position < len(self.trace):
            key = self.trace[position][0]
            if key in self.in_flight:
                break  # its fate after that need is not known yet
            now = state(key)
            if now == BUSY:
                break
            if now == ABSENT:
                if used >= self.bucket:
                    break
                used += self.numel[key]
                self.in_flight[key] = self.numel[key]
                chosen.append(key)
            position += 1
        self.frontier = position
        return chosen

    def end_of_step(self) -> None:
        """Backward ended; the first time, the recording is complete."""
        if self.recording and self.trace:
            self.recording = False
        self._restart(0)
        self.aligned = not self.recording

    def _restart(self, cursor: int) -> None:
        self.cursor, self.aligned, self.frontier = cursor, True, cursor
        self.in_flight.clear()
