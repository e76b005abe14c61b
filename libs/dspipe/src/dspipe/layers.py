"""DeepSpeed's layer specifications: a layer described by its type and arguments, built only on the
rank whose stage holds it (`LayerSpec`), or shared by several stages (`TiedLayerSpec`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .errors import PipelineError


class LayerSpec:
    """`LayerSpec(torch.nn.Linear, 1024, 1024, bias=False)`: builds `typename(*args, **kwargs)` on demand."""

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any):
        if not (isinstance(typename, type) and issubclass(typename, torch.nn.Module)):
            raise PipelineError(f"LayerSpec takes a torch.nn.Module subclass, got {typename!r}")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self, log: bool = False) -> torch.nn.Module:
        """A new module from the stored specification."""
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args] + [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"


class TiedLayerSpec(LayerSpec):
    """A layer whose module is shared by every position that names the same `key` (an input embedding
    reused as the output projection). Each rank holding one of those positions builds the module once;
    the weights named in `tied_weight_attr` (dotted attribute paths) start equal on every such rank and
    their gradients are summed across them before each step. `forward_fn(module, inputs)` replaces
    `module(inputs)` at this position when given."""

    def __init__(self, key: str, typename: type, *module_args: Any, forward_fn: Callable[..., Any] | None = None,
                 tied_weight_attr: str | Sequence[str] = ("weight",), **module_kwargs: Any):
        super().__init__(typename, *module_args, **module_kwargs)
        if not isinstance(key, str) or not key:
            raise PipelineError(f"TiedLayerSpec key must be a non-empty string, got {key!r}")
        if forward_fn is not None and not callable(forward_fn):
            raise PipelineError(f"TiedLayerSpec({key!r}) forward_fn must be callable as forward_fn(module, inputs), "
                                f"got {type(forward_fn).__name__}")
        attrs = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        if not attrs or not all(isinstance(a, str) and a for a in attrs):
            raise PipelineError(f"TiedLayerSpec({key!r}) tied_weight_attr must name one or more attributes, got "
                                f"{tied_weight_attr!r}")
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = attrs

    def __repr__(self) -> str:
        return f"Tied[{self.key}]:{super().__repr__()}"


def tied_weight(module: torch.nn.Module, path: str, key: str) -> torch.nn.Parameter:
    """The parameter at dotted `path` inside a tied module ("weight", "proj.weight")."""
    value: Any = module
    for part in path.split("."):
        if not hasattr(value, part):
            raise PipelineError(f"TiedLayerSpec({key!r}): {type(module).__name__} has no attribute {path!r} "
                                f"(tied_weight_attr names the shared weights)")
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise PipelineError(f"TiedLayerSpec({key!r}): {path!r} of {type(module).__name__} is a "
                            f"{type(value).__name__}, not a tensor")
    return value
