"""`deepspeed.compression.helper`: reach a submodule (or any attribute) of a model by its dotted name."""

from __future__ import annotations

from typing import Any


def _walk(root: Any, parts: list[str], dotted: str) -> Any:
    node = root
    for depth, part in enumerate(parts):
        try:
            node = getattr(node, part)
        except AttributeError:
            reached = ".".join(parts[:depth]) or type(root).__name__
            raise AttributeError(f"{dotted!r}: {reached} ({type(node).__name__}) has no attribute {part!r}") from None
    return node


def recursive_getattr(model: Any, module_name: str) -> Any:
    """`model.<a>.<b>...` for module_name "a.b...", e.g. recursive_getattr(model, "model.layers.0.mlp")."""
    return _walk(model, module_name.split("."), module_name)


def recursive_setattr(model: Any, module_name: str, module: Any) -> None:
    """Set `model.<a>.<b>...` to `module` (replacing a layer in place, as LoRA conversions do)."""
    *path, last = module_name.split(".")
    setattr(_walk(model, path, module_name), last, module)
