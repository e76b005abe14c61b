"""Stage-3 parameters gathered once for a block of forward passes, such as text generation.

    with dszero.HeldParameters(model.parameters()):      # one all-gather per unit, here
        model.generate(prompts, max_new_tokens=64)        # every token's forward: no collective at all
    # released on exit; the shards were never touched

Inside the block, the stage-3 hooks leave held units alone: no gather, no release, and nothing recorded in
the step's prefetch and reuse plans, so a training step after the block gathers exactly as it would have.
Ranks may therefore run different numbers of forwards inside it (different prompts, different lengths).
Collective on entry (every rank of each unit's group enters with the same parameters); leaving is local.
Parameters that are not partitioned pass through.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .units import Unit


def units_of(params: Iterable[torch.Tensor]) -> list[Unit]:
    """The stage-3 units of `params`, each once, in the order first met."""
    units: dict[int, Unit] = {}
    for param in params:
        unit = getattr(param, "_dszero_unit", None)
        if unit is not None:
            units.setdefault(id(unit), unit)
    return list(units.values())


class HeldParameters:
    """Gather the units of `params` and hold them gathered until the block ends (then release the ones
    that were not gathered before it)."""

    def __init__(self, params: Any):
        self.units = units_of([params] if isinstance(params, torch.Tensor) else params)
        self.was_gathered: list[bool] = []

    def __enter__(self) -> HeldParameters:
        self.was_gathered = [unit.gathered for unit in self.units]
        try:
            for unit in self.units:
                unit.gather()
                unit.held = True
        except BaseException:
            self._let_go()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._let_go()

    def _let_go(self) -> None:
        for unit, was in zip(self.units, self.was_gathered):
            unit.held = False
            if not was:
                unit.release()

    @property
    def gathered_bytes(self) -> int:
        """Bytes of the units this block gathered (what holding them costs)."""
        return sum(u.layout.padded_numel * u.model_flat.element_size()
                   for u, was in zip(self.units, self.was_gathered) if not was and not u.persistent)
