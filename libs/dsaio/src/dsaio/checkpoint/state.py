"""Nested state (an optimizer's state_dict: dicts with int keys, lists, ints, floats, strings
beside tensors) as a flat safetensors file.

Tensors become entries named by their path ("state.0.exp_avg"); everything else is a JSON
skeleton in `__metadata__["dsaio.state"]`, where each tensor leaf is {"__tensor__": name}.
Every container is tagged so that int keys, tuples and non-finite floats come back as they were.

The values a state may hold are a closed, declared set (`SUPPORTED_TYPES`): loading rebuilds them
from tags and never runs code named by the file, so a crafted file cannot execute anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

import numpy as np

from .api import _save, load_all
from .format import CheckpointError
from .tensors import is_torch

SUPPORTED_TYPES = ("torch tensors, numpy arrays and numpy scalars, dict (keys str, int, float, bool or None), list, "
                   "tuple, set, frozenset, str, bytes, int, float, bool, None, torch.dtype, torch.device, "
                   "torch.Size (comes back as a tuple), argparse.Namespace")


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
    if type(obj).__module__ == "torch" and type(obj).__name__ == "device":
        return {"__torch_device__": str(obj)}
    if isinstance(obj, (set, frozenset)):
        items = [_flatten(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(_ordered(obj))]
        return {"__frozenset__" if isinstance(obj, frozenset) else "__set__": items}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": bytes(obj).hex()}
    if isinstance(obj, argparse.Namespace):
        return {"__namespace__": _flatten(vars(obj), path, tensors)}
    raise TypeError(f"save_state_dict: value at {path or '<root>'!r} is a {type(obj).__module__}."
                    f"{type(obj).__qualname__}, which a checkpoint cannot hold (nothing is pickled); supported: "
                    f"{SUPPORTED_TYPES}. Store its state as plain data instead (e.g. obj.state_dict() or vars(obj))")


def _ordered(items: set | frozenset) -> list:
    # Sets have no order of their own: sort where the members allow it, so files are reproducible.
    try:
        return sorted(items)
    except TypeError:
        return list(items)


def check_state_dict(obj: Any) -> None:
    """Raises TypeError naming the first value that `save_state_dict` cannot store; writes nothing."""
    _flatten(obj, "", {})


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

        dtype = getattr(torch, str(node["__torch_dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(path, f"corrupted: {node['__torch_dtype__']!r} is not a torch dtype")
        return dtype
    if "__torch_device__" in node:
        import torch

        try:
            return torch.device(str(node["__torch_device__"]))
        except RuntimeError:
            raise CheckpointError(path, f"corrupted: {node['__torch_device__']!r} is not a device") from None
    if "__set__" in node:
        return {_rebuild(v, tensors, path) for v in node["__set__"]}
    if "__frozenset__" in node:
        return frozenset(_rebuild(v, tensors, path) for v in node["__frozenset__"])
    if "__bytes__" in node:
        try:
            return bytes.fromhex(str(node["__bytes__"]))
        except ValueError:
            raise CheckpointError(path, "corrupted: a bytes value is not hexadecimal") from None
    if "__namespace__" in node:
        fields = _rebuild(node["__namespace__"], tensors, path)
        if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
            raise CheckpointError(path, "corrupted: a Namespace's fields are not a dict of names")
        return argparse.Namespace(**fields)
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
