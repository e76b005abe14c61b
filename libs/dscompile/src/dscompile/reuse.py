"""Reuse from forward to backward (`stage3_max_reuse_distance`): a unit a forward graph releases stays
gathered for the backward when, in the micro-step before, it was gathered again within the reuse distance
and what is gathered stays within the live budget (`stage3_max_live_parameters`); the backward graph's
gather then takes that buffer instead of starting a collective. Eager ZeRO-3's reuse plan does the same,
so compiled and eager ZeRO-3 hold the same parameters between forward and backward.

Every decision is made from sizes and the order of the graphs' gathers, never from timings, so every rank
keeps the same units and issues the same collectives.
"""

from __future__ import annotations

import torch


class ForwardReuse:
    def __init__(self, reuse_bytes: int, live_bytes: int):
        self.reuse_bytes = reuse_bytes
        self.live_bytes = live_bytes
        self.kept: dict[int, torch.Tensor] = {}  # unit key -> its gathered buffer, in the order the forward released them
        self.clock = 0  # bytes gathered (or taken from `kept`) since the forward began
        self.released_at: dict[int, int] = {}  # unit key -> the clock when the forward released it
        self.distance: dict[int, int] = {}  # unit key -> bytes gathered between its forward release and its next use
        self.training = False  # the forward runs with gradients, so a backward follows

    def start_forward(self, training: bool) -> int:
        """A forward begins: what an earlier one kept is dropped (its bytes returned), the clock starts again."""
        dropped = self.drop()
        self.released_at.clear()
        self.clock = 0
        self.training = training
        return dropped

    def on_gather(self, unit: int, nbytes: int) -> torch.Tensor | None:
        """A graph needs `unit` (`nbytes` when gathered): its kept buffer, or None (gather it)."""
        released = self.released_at.pop(unit, None)
        if released is not None:
            self.distance[unit] = self.clock - released
        self.clock += nbytes
        return self.kept.pop(unit, None)

    def on_release(self, unit: int, buffer: torch.Tensor, live_bytes: int) -> bool:
        """A forward graph is done with `unit` (`live_bytes` gathered now, this buffer included): True when it
        stays gathered for the backward."""
        if not self.training:
            return False
        self.released_at[unit] = self.clock
        distance = self.distance.get(unit)
        if distance is None or distance > self.reuse_bytes or live_bytes > self.live_bytes:
            return False
        self.kept[unit] = buffer
        return True

    def make_room(self, needed: int, live_bytes: int) -> int:
        """Drop kept buffers (the ones the backward reads last first) until `needed` more bytes fit in the live
        budget; returns the bytes dropped."""
        dropped = 0
        while self.kept and live_bytes - dropped + needed > self.live_bytes:
            unit = next(iter(self.kept))
            dropped += _nbytes(self.kept.pop(unit))
        return dropped

    def drop(self) -> int:
        dropped = self.kept_bytes
        self.kept.clear()
        return dropped

    @property
    def kept_bytes(self) -> int:
        return sum(_nbytes(buffer) for buffer in self.kept.values())


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
