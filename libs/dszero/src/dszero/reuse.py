"""Which stage-3 units stay gathered after their forward (`stage3_max_reuse_distance`,
`stage3_max_live_parameters`); pure Python over unit keys and sizes.

The first forward + backward records the order in which units are gathered. From then on, when a
unit's forward ends, it stays gathered if its next use comes within `max_reuse_distance` elements
of other units' gathers and keeping it leaves at most `max_live_parameters` elements gathered (all
gathered units count: stage3.py also stops prefetching, and releases kept units, at that bound).
The last layers, whose backward follows their forward at once, are then not all-gathered twice.
Every rank records the same order and so makes the same choices, so collectives stay matched. A
gather off the recording (the end of an eval-only forward, a model that changes its order) keeps
nothing more until the recording's first unit is gathered again or the step ends; a unit released
too early is only gathered again, so every choice is safe.
"""

from __future__ import annotations


class ReusePolicy:
    def __init__(self, max_reuse_distance: int, max_live_parameters: int):
        self.max_reuse_distance = max_reuse_distance
        self.max_live = max_live_parameters
        self.trace: list[tuple[int, int]] = []  # (unit key, elements), in gather order
        self.recording = True
        self.enabled = max_reuse_distance > 0 and max_live_parameters > 0
        self.cursor = 0
        self.following = True  # this step's gathers have matched the recording so far
        self.last_event: dict[int, int] = {}
        self.reuse_distance: list[int | None] = []  # per event: elements gathered before its unit's next use
        self.live: dict[int, int] = {}  # units kept gathered -> elements

    def on_gather(self, key: int, numel: int) -> None:
        """A unit is needed (forward or backward pre-hook)."""
        if self.recording:
            self.trace.append((key, numel))
        elif self.following and self.cursor < len(self.trace) and self.trace[self.cursor][0] == key:
            pass
        elif self.trace and self.trace[0][0] == key:
            self.cursor, self.following = 0, True  # a forward starts again (after an eval-only forward, say)
        else:
            self.following = False  # off the recording: choose nothing from it until it starts again
        self.last_event[key] = self.cursor
        self.cursor += 1

    def keep_after_forward(self, key: int, numel: int, live_numel: int | None = None) -> bool:
        """Whether the unit whose forward just ended stays gathered for its backward. `live_numel`: the
        elements gathered now, this unit's included (default: the units this policy kept, plus it)."""
        if self.recording or not self.enabled or not self.following:
            return False
        event = self.last_event.get(key)
        distance = self.reuse_distance[event] if event is not None and event < len(self.reuse_distance) else None
        if distance is None or distance > self.max_reuse_distance:
            return False
        if (sum(self.live.values()) + numel if live_numel is None else live_numel) > self.max_live:
            return False
        self.live[key] = numel
        return True

    def released(self, key: int) -> None:
        self.live.pop(key, None)

    def end_of_step(self) -> None:
        """Backward ended: every unit was released; the first time, the recording is complete."""
        if self.recording:
            self.recording = False
            self.reuse_distance = self._distances()
        self.cursor = 0
        self.following = True  # this step's gathers have matched the recording so far
        self.last_event.clear()
        self.live.clear()

    def _distances(self) -> list[int | None]:
        before = [0]  # elements gathered before each event
        for _, numel in self.trace:
            before.append(before[-1] + numel)
        distances: list[int | None] = [None] * len(self.trace)
        next_seen: dict[int, int] = {}
        for position in range(len(self.trace) - 1, -1, -1):
            key = self.trace[position][0]
            following = next_seen.get(key)
            if following is not None:
                distances[position] = before[following] - before[position + 1]
            next_seen[key] = position
        return distances
