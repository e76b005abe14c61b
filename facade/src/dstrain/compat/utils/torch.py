"""`deepspeed.utils.torch`: DeepSpeed's checks of the running torch, for scripts (and its tests) that branch on them."""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion


def required_torch_version(min_version: float | str | None = None, max_version: float | str | None = None) -> bool:
    """Whether the running torch is at least `min_version` and at most `max_version` (either may be left out, not
    both), compared as versions: `required_torch_version(min_version=2.1)`."""
    if min_version is None and max_version is None:
        raise ValueError("required_torch_version: give min_version, max_version or both")
    running = TorchVersion(torch.__version__.split("+")[0])
    if min_version is not None and running < str(min_version):
        return False
    return not (max_version is not None and running > str(max_version))


def is_functorch_transforming() -> bool:
    """True inside torch.func.grad / vmap / jacrev: what the engine's hooks must then leave alone."""
    functorch = getattr(torch._C, "_functorch", None)
    peek = getattr(functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def register_grad_hook(param: torch.nn.Parameter, hook):
    """A hook that runs once `param.grad` holds the accumulated gradient."""
    return param.register_post_accumulate_grad_hook(hook)


__all__ = ["is_functorch_transforming", "register_grad_hook", "required_torch_version"]
