"""Eager ZeRO-3 for the code torch.compile leaves out of its graphs (around a graph break, a function
`torch._dynamo.disable` keeps eager, an op dynamo cannot trace).

dszero's own module hooks are off while DeepCompile runs (torch.compile breaks its graph at every module
with a backward hook, and dynamo traces forward hooks into its graphs, where they would do nothing). So
while a compiled forward runs, a torch function mode watches the torch calls that run eagerly: inside a
graph it traces to nothing (`torch.compiler.is_compiling()`); outside, a call that reads a partitioned
parameter gathers its unit first (eager ZeRO: every rank runs the same eager code, so the gathers match),
and when the call's outputs need gradients, a hook on them gathers the unit again before that call's
backward reads the parameter. The gradients then reach dszero's own gradient hooks and reduction. Units
gathered this way are released when the forward ends, and by dszero once their gradients are reduced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .ops import ALL as _OWN_OPS

# Tensor calls that read a parameter's metadata, never its values (torch.compile's wrappers make them).
_READS_NO_DATA = frozenset({"__get__", "__set__", "_is_view", "size", "dim", "stride", "storage_offset", "numel",
                            "nelement", "is_contiguous", "untyped_storage", "_typed_storage", "data_ptr",
                            "element_size", "is_floating_point", "is_complex", "register_hook", "get_device",
                            "register_post_accumulate_grad_hook", "requires_grad_", "is_pinned", "_version"})


class EagerGather(TorchFunctionMode):
    def __init__(self, runtime: Any):
        super().__init__()
        self.runtime = runtime
        self.gathered: dict[int, Any] = {}  # units this mode gathered during the current forward
        self.paused = False  # while a graph is compiled again (its tracing reads the placeholders' shapes only)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (self.paused or torch.compiler.is_compiling() or func in _OWN_OPS  # graphs' gathers read no placeholder
                or getattr(func, "__name__", None) in _READS_NO_DATA):
            return func(*args, **kwargs)
        units = self._partitioned_units(args, kwargs)
        for unit in units:
            unit.gather(compute=True)
            self.gathered[id(unit)] = unit
        result = func(*args, **kwargs)
        if units:
            self.runtime.stats["eager_gathers"] += len(units)
            if torch.is_grad_enabled():
                hook = _Regather(units)
                for tensor in tree_flatten(result)[0]:
                    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                        tensor.register_hook(hook)
        return result

    def _partitioned_units(self, args: Any, kwargs: Any) -> list[Any]:
        slots, units = self.runtime.slots, self.runtime.units
        found: dict[int, Any] = {}
        for item in tree_flatten((args, kwargs))[0]:
            slot = slots.get(id(item)) if isinstance(item, torch.Tensor) else None
            if slot is not None and slot.unit is not None:
                unit = units[slot.unit]
                if not unit.gathered:
                    found[id(unit)] = unit
        return list(found.values())

    def release_all(self) -> None:
        for unit in self.gathered.values():
            unit.release()
        self.gathered.clear()


class _Regather:
    """Gathers units once, when the first gradient of an eager call's outputs arrives in backward."""

    def __init__(self, units: list[Any]):
        self.units = units
        self.done = False

    def __call__(self, grad: torch.Tensor) -> None:
        if not self.done:
            self.done = True
            for unit in self.units:
                unit.gather(compute=True)
