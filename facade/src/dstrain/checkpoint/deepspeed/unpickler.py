"""DeepSpeed's `.pt` files read through a restricted unpickler: nothing in them runs.

A pickle names the functions and classes it calls (its globals), and a plain unpickler imports and calls
whatever it names: a crafted `mp_rank_00_model_states.pt` runs its code on load (DeepSpeed 0.19.8 loads
with weights_only=False). Here `find_class` admits only:
- torch's tensor and storage rebuild functions, `torch.Size`, dtypes and devices;
- containers, numbers and strings (`collections.OrderedDict`, `builtins.set`, ...);
- a short named list of DeepSpeed's own classes (`DEEPSPEED_RECORDS`, `DEEPSPEED_ENUMS`) and
  `argparse.Namespace`, which become plain data: a record's state as a dict, an enum as its value.
Any other global is refused with a CheckpointLoadError naming the file and the global, before it is
imported or called. torch.load drives the unpickler (its zip container, storages and mmap), with
ours as its `pickle_module`.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import importlib
import os
import pickle
import types
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointLoadError

RECORD_CLASS_KEY = "__deepspeed_class__"  # a record's dict names the DeepSpeed class it stood for

# DeepSpeed classes whose pickled instances are read as their attribute dict (see the facade README).
DEEPSPEED_RECORDS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.fp16.loss_scaler.LossScalerBase",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.checkpoint.universal_checkpoint.SubparamShape",
})
# DeepSpeed enums, read as their value (ZeroStageEnum(2) -> 2).
DEEPSPEED_ENUMS = frozenset({
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum",
    "deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum",
    "deepspeed.runtime.config.DtypeEnum",
})

_TORCH_FUNCTIONS = {
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"),
}
_TORCH_CLASSES = {("torch", "Size"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"), ("torch", "device")}
_PLAIN = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("_codecs", "encode"): lambda text, encoding="latin1": str(text).encode(str(encoding)),  # protocol 2's bytes
}
_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")


class _Record:
    """What a DeepSpeed class in DEEPSPEED_RECORDS becomes while unpickling: its name, arguments and state."""

    class_name = ""

    def __new__(cls, *args: Any, **kwargs: Any):
        record = object.__new__(cls)
        record.args = args
        record.state = {}
        return record

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # a REDUCE call: the arguments are kept
        self.args = args
        self.state = dict(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(p, dict | None) for p in state):
            merged: dict = {}
            for part in state:  # (__dict__, __slots__ values)
                merged.update(part or {})
            state = merged
        self.state = dict(state) if isinstance(state, dict) else {"state": state}

    def plain(self) -> dict[str, Any]:
        out: dict[str, Any] = {RECORD_CLASS_KEY: self.class_name}
        if self.args:
            out["args"] = list(self.args)
        out.update(self.state)
        return out


def _record_type(qualified: str) -> type:
    return type(qualified.rsplit(".", 1)[1], (_Record,), {"class_name": qualified})


def _enum_value(value: Any, *_: Any) -> Any:
    return value


class _Namespace(_Record):
    """argparse.Namespace: rebuilt as a real Namespace of its (plain) attributes after loading."""

    class_name = "argparse.Namespace"


class _NumpyDtype(_Record):
    """numpy.dtype(code, align, copy) and its pickled state: only a plain numeric code is honoured."""

    class_name = "numpy.dtype"


class _NumpyArray(_Record):
    """numpy's _reconstruct(ndarray, shape, dtype) then its state (version, shape, dtype, fortran, bytes)."""

    class_name = "numpy.ndarray"


class _NumpyMarker:
    """`numpy.ndarray` named as _reconstruct's first argument: a marker, never called."""


def _numpy_scalar(dtype: Any, data: bytes = b"") -> Any:
    return _numpy_from_bytes(data, _numpy_dtype(dtype), (), False).item()  # a numpy scalar becomes a Python number


def restricted_pickle_module(path: str | os.PathLike) -> types.ModuleType:
    """A pickle module for torch.load(pickle_module=...) whose Unpickler refuses every global not listed
    above; the errors name `path`."""
    where = os.fspath(path)

    class RestrictedUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            return admitted_global(module, name, where)

    module = types.ModuleType("dstrain_restricted_pickle")
    module.Unpickler = RestrictedUnpickler  # type: ignore[attr-defined]
    module.load = lambda file, **kwargs: RestrictedUnpickler(file, **kwargs).load()  # type: ignore[attr-defined]
    module.UnpicklingError = pickle.UnpicklingError  # type: ignore[attr-defined]
    return module


def admitted_global(module: str, name: str, where: str) -> Any:
    """The object a pickle's global `module.name` stands for, or CheckpointLoadError: nothing else is imported."""
    # Protocol 2 (torch.save's) writes Python 2's names for some modules (builtins -> __builtin__): read them back.
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    key = (module, name)
    qualified = f"{module}.{name}"
    if key in _TORCH_FUNCTIONS or key in _TORCH_CLASSES:
        return getattr(importlib.import_module(module), name)
    if module == "torch" and name in _DTYPES:
        return getattr(torch, name)
    if key in _PLAIN:
        return _PLAIN[key]
    if qualified == "argparse.Namespace":
        return _Namespace
    if qualified in DEEPSPEED_RECORDS:
        return _record_type(qualified)
    if qualified in DEEPSPEED_ENUMS:
        return _enum_value
    if module in _NUMPY_MODULES and name == "_reconstruct":
        return _NumpyArray
    if module in _NUMPY_MODULES and name == "scalar":
        return _numpy_scalar
    if qualified == "numpy.ndarray":
        return _NumpyMarker
    if qualified == "numpy.dtype":
        return _NumpyDtype
    raise CheckpointLoadError(
        f"{where}: the file's pickle calls {qualified}, which a DeepSpeed checkpoint is not allowed to: only "
        f"tensors, containers, numbers, strings, numpy arrays, DeepSpeed's loss scalers, enums and fragment "
        f"addresses and argparse.Namespace are read (nothing in the file was run). If you trust this file, re-save "
        f"what you need as plain tensors and containers")


def _numpy_dtype(record: Any) -> Any:
    import numpy

    code = record.args[0] if isinstance(record, _NumpyDtype) and record.args else record
    if not isinstance(code, str):
        raise CheckpointLoadError(f"a numpy dtype in the file is described by {code!r}, not a type code")
    dtype = numpy.dtype(code)
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise CheckpointLoadError(f"a numpy array in the file has dtype {code!r}: only plain numeric arrays are read")
    state = record.state.get("state") if isinstance(record, _NumpyDtype) else None
    if isinstance(state, tuple) and len(state) > 1:
        order = state[1]  # (version, byte order, ...): the byte order the array was written in
        if order in ("<", ">"):
            dtype = dtype.newbyteorder(order)
    return dtype


def _numpy_from_bytes(data: Any, dtype: Any, shape: tuple, fortran: bool) -> Any:
    import numpy

    if not isinstance(data, bytes | bytearray):
        raise CheckpointLoadError(f"a numpy array in the file holds {type(data).__name__} data, not bytes")
    count = 1
    for dim in shape:
        count *= int(dim)
    if count * dtype.itemsize != len(data):
        raise CheckpointLoadError(f"a numpy array in the file has {len(data)} bytes for shape {tuple(shape)} of "
                                  f"{dtype} (truncated or corrupt)")
    return numpy.frombuffer(bytes(data), dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def _numpy_array(record: _NumpyArray) -> Any:
    state = record.state.get("state")
    if not (isinstance(state, tuple) and len(state) == 5):
        raise CheckpointLoadError("a numpy array in the file has no readable state")
    _version, shape, dtype, fortran, data = state
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointLoadError(f"a numpy array in the file has shape {shape!r}")
    return _numpy_from_bytes(data, _numpy_dtype(dtype), shape, bool(fortran))


def load_pickle(path: str | os.PathLike) -> Any:
    """The contents of a torch `.pt` file, read through the restricted unpickler, with DeepSpeed's records
    turned into plain dicts (RECORD_CLASS_KEY names their class) and Namespaces rebuilt. The tensors of
    torch's zip files are mapped, not read: only what is used is read from the disk (a loading rank needs
    its own shard of the optimizer's state, not every rank's). So the file must not be rewritten in place
    while they are in use: write a new file and rename it over the old one."""
    file = Path(path)
    if not file.is_file():
        raise CheckpointLoadError(f"{file}: no such file")
    if os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true"):
        raise CheckpointLoadError(f"{file}: TORCH_FORCE_WEIGHTS_ONLY_LOAD is set, which makes torch.load refuse the "
                                  f"restricted unpickler that reads DeepSpeed's files; unset it to load this file")
    try:
        loaded = torch.load(file, map_location="cpu", pickle_module=restricted_pickle_module(file),
                            weights_only=False, mmap=_mappable(file))
    except CheckpointLoadError:
        raise
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, KeyError, TypeError, AttributeError,
            OSError) as exc:
        raise CheckpointLoadError(f"{file}: not a readable torch checkpoint file (truncated or corrupt?): "
                                  f"{type(exc).__name__}: {exc}") from None
    return plain_data(loaded)


def _mappable(file: Path) -> bool:
    """Whether `file` is a torch zip whose every record lies inside the file, so mapping it is safe (a record
    past the end would be a bus error on first touch, not an exception); False for torch's legacy format."""
    if not zipfile.is_zipfile(file):
        return False
    size = file.stat().st_size
    try:
        with zipfile.ZipFile(file) as archive, open(file, "rb") as raw:
            for info in archive.infolist():
                raw.seek(info.header_offset)
                header = raw.read(30)  # the local header: its name and extra lengths place the data
                if len(header) < 30 or header[:4] != b"PK\x03\x04":
                    raise zipfile.BadZipFile(f"no local header for {info.filename}")
                start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") \
                    + int.from_bytes(header[28:30], "little")
                if info.compress_type != zipfile.ZIP_STORED or start + info.compress_size > size:
                    raise CheckpointLoadError(f"{file}: the record {info.filename} lies past the end of the file or "
                                              f"is compressed (truncated, or not written by torch.save)")
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointLoadError(f"{file}: not a readable torch checkpoint file (truncated or corrupt?): {exc}") \
            from None
    return True


def plain_data(value: Any) -> Any:
    """Records to dicts, Namespaces and numpy arrays rebuilt, through containers (tensors left as they are)."""
    if isinstance(value, _NumpyArray):
        return _numpy_array(value)
    if isinstance(value, _Namespace):
        return argparse.Namespace(**{str(k): plain_data(v) for k, v in value.plain().items()
                                     if k != RECORD_CLASS_KEY and k != "args"})
    if isinstance(value, _Record):
        return {k: plain_data(v) for k, v in value.plain().items()}
    if isinstance(value, dict):
        converted = {k: plain_data(v) for k, v in value.items()}
        return collections.OrderedDict(converted) if isinstance(value, collections.OrderedDict) else converted
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple(plain_data(v) for v in value)
    return value
