"""Eager ZeRO-3 for the code torch.compile leaves out of its graphs (the regions around a graph break).

dszero's own module hooks are off while DeepCompile runs (torch.compile breaks its graph at every module
with a backward hook), so these take their place outside graphs only: inside a graph they trace to
nothing (`torch.compiler.is_compiling()`), and a module run eagerly has its units gathered before its
forward, released after it, and gathered again when its backward starts (a hook on its outputs'
gradients). Its gradients then reach dszero's own gradient hooks and reduction, as in eager ZeRO-3.
"""

from __future__ import annotations

from typing import Any

import torch


class EagerFallback:
    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.handles: list[Any] = []
        self.stats = runtime.stats

    def install(self) -> EagerFallback:
        stage3 = self.runtime.controls.stage3
        for module in stage3.hooked_modules:
            self.handles.append(module.register_forward_pre_hook(self._before_forward))
            self.handles.append(module.register_forward_hook(self._after_forward))
        return self

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _units(self, module: torch.nn.Module) -> list[Any]:
        return self.runtime.controls.units_of_module(module)

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        for unit in self._units(module):
            unit.gather(compute=True)
        self.stats["eager_regions"] += 1

    def _after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        units = self._units(module)
        for unit in units:
            unit.release()
        if self.runtime.window_depth:
            self.runtime.hollow_released()
        if torch.is_grad_enabled():
            _on_gradients(output, _Regather(units))


class _Regather:
    """Gathers a module's units once, when the first gradient of its outputs arrives in backward."""

    def __init__(self, units: list[Any]):
        self.units = units
        self.done = False

    def __call__(self, grad: torch.Tensor) -> None:
        if not self.done:
            self.done = True
            for unit in self.units:
                unit.gather(compute=True)


def _on_gradients(output: Any, hook: _Regather) -> None:
    if isinstance(output, torch.Tensor):
        if output.requires_grad:
            output.register_hook(hook)
    elif isinstance(output, (list, tuple)):
        for item in output:
            _on_gradients(item, hook)
    elif isinstance(output, dict):
        for item in output.values():
            _on_gradients(item, hook)
