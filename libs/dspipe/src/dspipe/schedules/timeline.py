"""What a run (simulated or measured) looked like: per-rank busy and idle time, bubble, memory.

The bubble is idle time per unit of useful (compute) time, summed over ranks: Megatron's bubble time
fraction, (p-1)/m for 1F1B. `idle_fraction` is idle over the whole rank-time instead, (p-1)/(m+p-1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from .action import Kind
from .trace import TraceEvent


@dataclass(frozen=True)
class Timeline:
    """Events of a pipeline run. Times are shifted so that the earliest start is 0."""

    events: tuple[TraceEvent, ...]
    ranks: int

    @classmethod
    def of(cls, events: Iterable[TraceEvent], ranks: int | None = None) -> Timeline:
        events = tuple(events)
        origin = min((e.start for e in events), default=0.0)
        # Kept sorted by (rank, start, end); simulate builds its events in that order directly.
        shifted = tuple(sorted((TraceEvent(e.rank, e.action, e.start - origin, e.end - origin) for e in events),
                               key=lambda e: (e.rank, e.start, e.end)))
        if ranks is None:
            ranks = 1 + max((e.rank for e in shifted), default=0)
        return cls(shifted, ranks)

    @cached_property
    def makespan(self) -> float:
        return max((e.end for e in self.events), default=0.0)

    @cached_property
    def busy(self) -> tuple[float, ...]:
        """Compute time (F, B, I, W) of each rank."""
        busy = [0.0] * self.ranks
        for e in self.events:
            if e.action.kind.is_compute:
                busy[e.rank] += e.duration
        return tuple(busy)

    @cached_property
    def idle(self) -> tuple[float, ...]:
        """Time each rank spends not computing, between the run's start and its end."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble(self) -> float:
        """Idle time per unit of compute time, over all ranks."""
        useful = sum(self.busy)
        return sum(self.idle) / useful if useful else 0.0

    @property
    def idle_fraction(self) -> float:
        """Idle share of all rank-time."""
        total = self.ranks * self.makespan
        return sum(self.idle) / total if total else 0.0

    @cached_property
    def peak_activations(self) -> tuple[int, ...]:
        """Most (stage, micro-batch) activations each rank held at once: from the start of a forward until
        its backward is complete (B, or W when the backward is split into I and W)."""
        changes: list[list[tuple[float, int]]] = [[] for _ in range(self.ranks)]
        for e in self.events:
            kind = e.action.kind
            if kind is Kind.F:
                changes[e.rank].append((e.start, +1))
            elif kind in (Kind.B, Kind.W):
                changes[e.rank].append((e.end, -1))
        peaks = []
        for rank_changes in changes:
            held = peak = 0
            for _, delta in sorted(rank_changes):  # at equal times a release (-1) sorts before a new forward
                held += delta
                peak = max(peak, held)
            peaks.append(peak)
        return tuple(peaks)

    def summary(self) -> str:
        return (f"makespan {self.makespan:g}, bubble {self.bubble:.4f} (idle per compute time), "
                f"idle {self.idle_fraction:.1%} of rank-time, peak activations per rank "
                f"{list(self.peak_activations)}")
