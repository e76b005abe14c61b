"""What a compiler needs to run a `ZeroOptimizer`'s partitioning from a graph (dscompile's DeepCompile).

A compiled graph gathers, releases and reduces by itself, but through these controls, so compiled
and eager ZeRO share one partitioning, one reduction order and one checkpoint format:

- `gather_into(unit, buffer)`: a stage-3 unit's whole weights, into a buffer the graph owns;
- `accept_gradient(param, grad)`: a gradient handed over by the graph instead of returned to autograd,
  reduced exactly as the stage's hooks would reduce it (same buckets, same fixed order);
- `remove_module_hooks()` / `restore_module_hooks()`: stage 3's gathering hooks off while a compiler
  schedules the gathers (torch.compile breaks its graph at every module with a backward hook);
- `keep_gathered(unit, True)`: a unit stays gathered across steps (selective gather);
- `offload_states()` / `reload_states()`: optimizer states to host memory and back.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import ZeroError
from .stage3 import Stage3
from .units import Unit


class CompilerControls:
    def __init__(self, zero: Any):
        self.zero = zero
        self.stage = zero.stage
        reducer = zero.reducer
        if not hasattr(reducer, "accept_gradient"):
            raise ZeroError(f"ZeRO stage {self.stage}'s reducer ({type(reducer).__name__}) takes no handed-over "
                            f"gradients; a compiler cannot reduce through it")
        self.reducer = reducer
        self.stage3: Stage3 | None = reducer if isinstance(reducer, Stage3) else None

    # ------------------------------------------------------------------ what is partitioned
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters this optimizer reduces (and at stage 3 partitions), in a fixed order on every rank."""
        if self.stage3 is not None:
            return [p for unit in self.stage3.units for p in unit.params]
        return [p for group in self.zero.groups for p in group.params]

    def units(self) -> list[Unit]:
        return list(self.stage3.units) if self.stage3 is not None else []

    def unit_of(self, param: torch.nn.Parameter) -> Unit | None:
        return self.stage3.unit_of_param.get(id(param)) if self.stage3 is not None else None

    def units_of_module(self, module: torch.nn.Module) -> list[Unit]:
        return list(self.stage3.units_of_module.get(id(module), ())) if self.stage3 is not None else []

    # ------------------------------------------------------------------ gather, reduce
    @staticmethod
    def gather_into(unit: Unit, buffer: torch.Tensor, async_op: bool = False) -> Any:
        return unit.gather_into(buffer, async_op=async_op)

    def accept_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        self.reducer.accept_gradient(param, grad)

    def remove_module_hooks(self) -> None:
        if self.stage3 is not None:
            self.stage3.remove_module_hooks()

    def restore_module_hooks(self) -> None:
        if self.stage3 is not None:
            self.stage3.restore_module_hooks()

    @property
    def module_hooks_on(self) -> bool:
        """Whether stage 3's gathering hooks are registered now (False below stage 3, or while removed)."""
        return self.stage3 is not None and bool(self.stage3.module_hook_handles)

    @staticmethod
    def keep_gathered(unit: Unit, keep: bool) -> None:
        unit.set_persistent(keep)

    def finish_reductions(self) -> None:
        """Wait for every gradient reduction in flight (stage 2's overlapped buckets)."""
        finish = getattr(self.reducer, "finish", None)
        if finish is not None:
            finish()

    def set_overlap(self, overlap: bool) -> None:
        """Stage 2: reduce buckets asynchronously through two staging buffers (True) or one at a time."""
        reducer = self.reducer
        if not hasattr(reducer, "staging") or reducer.overlap == overlap:
            return
        reducer.finish()
        reducer.overlap = overlap
        reducer.staging = [reducer.staging[0]] + ([torch.zeros_like(reducer.staging[0])] if overlap else [])

    # ------------------------------------------------------------------ shards between uses
    @staticmethod
    def shards_can_move(units: list[Unit]) -> bool:
        """Whether every unit's shard lives apart from its master weights (moving one would move the other)."""
        return all(unit.separate_master or getattr(unit.home, "where", None) != "device" for unit in units)

    @staticmethod
    def move_shard(unit: Unit, to_host: bool) -> bool:
        """Move a device-resident shard to host memory (to_host) or back; False when nothing had to move
        (shards homed on the CPU or NVMe by offload_param, or a CPU run where host and device are one)."""
        home = unit.home
        if getattr(home, "where", None) != "device":
            return False
        target = torch.device("cpu") if to_host else unit.model_flat.device
        if home.tensor.device == target:
            return False
        if not unit.separate_master:
            raise ZeroError("a stage-3 shard that is also its master weights cannot leave the device (the "
                            "optimizer updates it there)")
        moved = home.tensor.to(target, non_blocking=True)
        home.tensor = moved.pin_memory() if to_host and torch.cuda.is_available() else moved
        return True

    # ------------------------------------------------------------------ optimizer states
    def offload_states(self, pin_memory: bool = True) -> None:
        self.zero.offload_states(pin_memory=pin_memory)

    def reload_states(self) -> None:
        self.zero.reload_states()
