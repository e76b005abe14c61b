"""Nested state (an optimizer's state_dict: dicts with int keys, lists, ints, floats, strings
beside tensors) as a flat safetensors file.

Tensors become entries named by their path ("state.0.exp_avg"); everything else is a JSON
skeleton in `__metadata__["dsaio.state"]`, where each tensor leaf is {"__tensor__": name}.
Every container is tagged so that int keys, tuples and non-finite floats come back as they were.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from .api import _save, load_all
from .format import CheckpointError
from .tensors import is_torch


def _flatten(obj: Any, path: str, tensors: dict[str, Any]) -> Any:
    if is_torch(obj) or isinstance(obj, np.ndarray):
        name, n = path or "tensor", 1
        while name in tensors:
            n += 1
            name = f"{path}#{n}"
        tensors[name] = obj
        return {"__tensor__": name}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, np.generic):
        return _flatten(obj.item(), path, tensors)
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"save_state_dict: key {k!r} at {path or '<root>'!r} is a {type(k).__name__}; "
                                "keys must be str, int, float, bool or None")
            items.append([_flatten(k, "", {}), _flatten(v, f"{path}.{k}" if path else str(k), tensors)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        seq = [_flatten(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else {"__tuple__": seq}
    if type(obj).__module__ == "torch" and type(obj).__name__ == "dtype":
        return {"__torch_dtype__": str(obj).removeprefix("torch.")}
    raise TypeError(f"save_state_dict: value at {path or '<root>'!r} is a {type(obj).__name__}; supported: "
                    "tensors, numpy arrays, dict, list, tuple, str, int, float, bool, None")


def _rebuild(node: Any, tensors: dict[str, Any], path: str) -> Any:
    if isinstance(node, list):
        return [_rebuild(v, tensors, path) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        name = node["__tensor__"]
        if name not in tensors:
            raise CheckpointError(path, f"corrupted: the state refers to tensor {name!r}, which the file lacks")
        return tensors[name]
    if "__dict__" in node:
        return {_rebuild(k, tensors, path): _rebuild(v, tensors, path) for k, v in node["__dict__"]}
    if "__tuple__" in node:
        return tuple(_rebuild(v, tensors, path) for v in node["__tuple__"])
    if "__float__" in node:
        return float(node["__float__"])
    if "__torch_dtype__" in node:
        import torch

        return getattr(torch, node["__torch_dtype__"])
    raise CheckpointError(path, f"corrupted: unknown node in the state skeleton: {sorted(node)}")


def save_state_dict(obj: Any, path: str | os.PathLike, *, engine: str | None = None) -> None:
    """Writes nested state to a safetensors file, atomically and durably (see `dsaio.save`)."""
    tensors: dict[str, Any] = {}
    skeleton = _flatten(obj, "", tensors)
    _save(tensors, os.fspath(path), {"dsaio.state": json.dumps(skeleton, separators=(",", ":"))}, engine,
          reserved_ok=True)


def load_state_dict(path: str | os.PathLike, device: str = "cpu", *, framework: str | None = None,
                    verify: bool = True, engine: str | None = None) -> Any:
    """Reads what `save_state_dict` wrote, tensors and all."""
    path = os.fspath(path)
    tensors, metadata = load_all(path, device, framework, verify, engine)
    if "dsaio.state" not in metadata:
        raise CheckpointError(path, "not a state-dict file (no dsaio.state in its metadata); use dsaio.load")
    try:
        skeleton = json.loads(metadata["dsaio.state"])
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, f"corrupted: the state skeleton is not valid JSON ({exc})") from None
    return _rebuild(skeleton, tensors, path)
