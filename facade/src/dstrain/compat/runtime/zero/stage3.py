"""`deepspeed.runtime.zero.stage3`: the kind of optimizer ZeRO stage 3 trains with (see optimizer_kinds), and
`unwrap_model_for_generation` (TRL's and DeepSpeed-Chat's way to generate from a ZeRO-3 engine)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import dszero

from ..optimizer_kinds import DeepSpeedZeroOptimizer_Stage3


@contextlib.contextmanager
def unwrap_model_for_generation(model: Any) -> Iterator[Any]:
    """Every weight of `model` (an engine, or a module) gathered once, and stage 3's per-module gathering hooks
    off, for the block: generation then runs forward after forward on whole weights without a collective per
    layer. The hooks are back after it, so training goes on; outside stage 3 the weights are whole already.
    Yields `model`. Under stage 3 every rank must enter the block (the gather is a collective)."""
    module = getattr(model, "module", model)
    zero = getattr(model, "optimizer", None)
    controls = dszero.CompilerControls(zero) if isinstance(zero, dszero.ZeroOptimizer) and zero.stage == 3 else None
    with dszero.GatheredParameters(list(module.parameters())):
        hooks_off = controls is not None and controls.module_hooks_on
        if hooks_off:
            controls.remove_module_hooks()
        try:
            yield model
        finally:
            if hooks_off:
                controls.restore_module_hooks()


__all__ = ["DeepSpeedZeroOptimizer_Stage3", "unwrap_model_for_generation"]
