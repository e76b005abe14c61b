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
from collections.abc import Mapping
from typing import Any

import numpy as np

from .api import _save, checked_metadata, load_all
from .format import CheckpointError
from .header import parse_json, show
from .tensors import is_torch

MAX_NESTING = 100  # containers within containers; real state dicts use fewer than 10
SUPPORTED_TYPES = ("torch tensors, numpy arrays and numpy scalars, dict (keys str, int, float, bool or None), list, "
                   "tuple, set, frozenset, str, bytes, int, float, bool, None, torch.dtype, torch.device, "
                   "torch.Size (comes back as a tuple), argparse.Namespace")


def _flatten(obj: Any, path: str, tensors: dict[str, Any], depth: int = 0) -> Any:
    if depth > MAX_NESTING:
        raise ValueError(f"save_state_dict: the value at {path or '<root>'!r} is nested more than {MAX_NESTING} "
                         "containers deep (does a container hold itself?)")
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
        return _flatten(obj.item(), path, tensors, depth)
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"save_state_dict: key {k!r} at {path or '<root>'!r} is a {type(k).__name__}; "
                                "keys must be str, int, float, bool or None")
            items.append([_flatten(k, "", {}), _flatten(v, f"{path}.{k}" if path else str(k), tensors, depth + 1)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        seq = [_flatten(v, f"{path}.{i}" if path else str(i), tensors, depth + 1) for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else {"__tuple__": seq}
    if type(obj).__module__ == "torch" and type(obj).__name__ == "dtype":
        return {"__torch_dtype__": str(obj).removeprefix("torch.")}
    if type(obj).__module__ == "torch" and type(obj).__name__ == "device":
        return {"__torch_device__": str(obj)}
    if isinstance(obj, (set, frozenset)):
        items = [_flatten(v, f"{path}.{i}" if path else str(i), tensors, depth + 1)
                 for i, v in enumerate(_ordered(obj))]
        return {"__frozenset__" if isinstance(obj, frozenset) else "__set__": items}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": bytes(obj).hex()}
    if isinstance(obj, argparse.Namespace):
        return {"__namespace__": _flatten(vars(obj), path, tensors, depth + 1)}
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


def _rebuild(node: Any, tensors: dict[str, Any], path: str, depth: int = 0) -> Any:
    """The value a skeleton node stands for; anything not exactly as `_flatten` writes it is refused."""
    if depth > MAX_NESTING:
        raise _corrupt(path, f"containers nest more than {MAX_NESTING} deep")
    if isinstance(node, list):
        return [_rebuild(v, tensors, path, depth + 1) for v in node]
    if not isinstance(node, dict):
        return node  # None, bool, int, str, or a finite float (the parser refuses NaN and Infinity)
    if len(node) != 1:
        raise _corrupt(path, f"a node holds {show(sorted(node))}; a node holds exactly one of {', '.join(_TAGS)}")
    ((tag, value),) = node.items()
    if tag not in _TAGS:
        raise _corrupt(path, f"unknown node {show(tag)}; known: {', '.join(_TAGS)}")
    return _TAGS[tag](value, tensors, path, depth)


def _corrupt(path: str, detail: str) -> CheckpointError:
    return CheckpointError(path, f"corrupted: dsaio.state: {detail}")


def _expect(value: Any, kind: type, tag: str, path: str) -> Any:
    if not isinstance(value, kind):
        raise _corrupt(path, f"{tag} holds {show(value)}, expected a {kind.__name__}")
    return value


def _tensor(value: Any, tensors: dict[str, Any], path: str, depth: int) -> Any:
    name = _expect(value, str, "__tensor__", path)
    if name not in tensors:
        raise _corrupt(path, f"__tensor__ refers to tensor {show(name)}, which the file lacks")
    return tensors[name]


def _dict(value: Any, tensors: dict[str, Any], path: str, depth: int) -> dict:
    out = {}
    for pair in _expect(value, list, "__dict__", path):
        if not isinstance(pair, list) or len(pair) != 2:
            raise _corrupt(path, f"__dict__ holds {show(pair)}, expected [key, value] pairs")
        key = _key(pair[0], path)
        out[key] = _rebuild(pair[1], tensors, path, depth + 1)
    return out


def _key(node: Any, path: str) -> Any:
    if isinstance(node, dict) and set(node) == {"__float__"}:
        return _float(node["__float__"], {}, path, 0)
    if node is not None and not isinstance(node, (bool, int, float, str)):
        raise _corrupt(path, f"a __dict__ key is {show(node)}; keys are str, int, float, bool or None")
    return node


def _members(tag: str) -> Any:
    def rebuild(value: Any, tensors: dict[str, Any], path: str, depth: int) -> list:
        return [_rebuild(v, tensors, path, depth + 1) for v in _expect(value, list, tag, path)]
    return rebuild


def _hashable(kind: type, tag: str) -> Any:
    def rebuild(value: Any, tensors: dict[str, Any], path: str, depth: int) -> Any:
        members = _members(tag)(value, tensors, path, depth)
        try:
            return kind(members)
        except TypeError:
            raise _corrupt(path, f"{tag} holds an unhashable member: {show(members)}") from None
    return rebuild


def _float(value: Any, tensors: dict[str, Any], path: str, depth: int) -> float:
    if value not in _NON_FINITE:  # finite floats are plain JSON numbers
        raise _corrupt(path, f"__float__ holds {show(value)}, expected one of {', '.join(_NON_FINITE)}")
    return float(value)


def _torch(path: str, what: str) -> Any:
    try:
        import torch
    except ImportError:
        raise CheckpointError(path, f"the state holds a {what}, which needs torch: pip install torch") from None
    return torch


def _torch_dtype(value: Any, tensors: dict[str, Any], path: str, depth: int) -> Any:
    torch = _torch(path, "torch.dtype")
    # Looked up in the module's own names only: getattr could import submodules lazily.
    dtype = torch.__dict__.get(_expect(value, str, "__torch_dtype__", path))
    if not isinstance(dtype, torch.dtype):
        raise _corrupt(path, f"__torch_dtype__ holds {show(value)}, which is not a torch dtype")
    return dtype


def _torch_device(value: Any, tensors: dict[str, Any], path: str, depth: int) -> Any:
    torch = _torch(path, "torch.device")
    try:
        return torch.device(_expect(value, str, "__torch_device__", path))
    except (RuntimeError, ValueError):
        raise _corrupt(path, f"__torch_device__ holds {show(value)}, which is not a device") from None


def _bytes(value: Any, tensors: dict[str, Any], path: str, depth: int) -> bytes:
    try:
        return bytes.fromhex(_expect(value, str, "__bytes__", path))
    except ValueError:
        raise _corrupt(path, f"__bytes__ holds {show(value)}, which is not hexadecimal") from None


def _namespace(value: Any, tensors: dict[str, Any], path: str, depth: int) -> argparse.Namespace:
    if not isinstance(value, dict) or set(value) != {"__dict__"}:
        raise _corrupt(path, f"__namespace__ holds {show(value)}, expected a __dict__ node of its fields")
    fields = _dict(value["__dict__"], tensors, path, depth + 1)
    if not all(isinstance(k, str) for k in fields):
        raise _corrupt(path, f"__namespace__ field names must be strings, got {show(list(fields))}")
    return argparse.Namespace(**fields)


_NON_FINITE = ("inf", "-inf", "nan")
_TAGS = {"__tensor__": _tensor, "__dict__": _dict, "__tuple__": lambda *a: tuple(_members("__tuple__")(*a)),
         "__float__": _float, "__torch_dtype__": _torch_dtype, "__torch_device__": _torch_device,
         "__set__": _hashable(set, "__set__"), "__frozenset__": _hashable(frozenset, "__frozenset__"),
         "__bytes__": _bytes, "__namespace__": _namespace}


def save_state_dict(obj: Any, path: str | os.PathLike, *, metadata: Mapping[str, str] | None = None,
                    engine: str | None = None) -> None:
    """Writes nested state to a safetensors file, atomically and durably (see `dsaio.save`); `metadata`
    (str to str) is stored beside it in the header, where `dsaio.read_metadata` finds it without the data."""
    tensors: dict[str, Any] = {}
    skeleton = _flatten(obj, "", tensors)
    header = {**checked_metadata(metadata), "dsaio.state": json.dumps(skeleton, separators=(",", ":"))}
    _save(tensors, os.fspath(path), header, engine, reserved_ok=True)


def load_state_dict(path: str | os.PathLike, device: str = "cpu", *, framework: str | None = None,
                    verify: bool = True, engine: str | None = None) -> Any:
    """Reads what `save_state_dict` wrote, tensors and all."""
    path = os.fspath(path)
    tensors, metadata = load_all(path, device, framework, verify, engine)
    if "dsaio.state" not in metadata:
        raise CheckpointError(path, "not a state-dict file (no dsaio.state in its metadata); use dsaio.load")
    return _rebuild(parse_json(metadata["dsaio.state"], path, "dsaio.state"), tensors, path)
