"""`save` / `load` for flat mappings of names to tensors or arrays."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .format import DTYPES, CheckpointError, Entry
from .header import decode_header, header_length
from .reader import read_file
from .tensors import as_numpy, as_torch, host_bytes, is_torch
from .writer import write_atomic


def save(tensors: Mapping[str, Any], path: str | os.PathLike, metadata: Mapping[str, str] | None = None,
         *, engine: str | None = None) -> None:
    """Writes `tensors` (torch tensors or numpy arrays) to a safetensors file, atomically and durably.

    `metadata` is stored as the file's string-to-string `__metadata__`; keys starting with
    "dsaio." are reserved.
    """
    return _save(tensors, os.fspath(path), checked_metadata(metadata), engine, reserved_ok=False)


def checked_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's metadata as a dict, refused unless it maps str to str outside dsaio's "dsaio." keys."""
    metadata = dict(metadata or {})
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"save: metadata must map str to str, got {k!r}: {type(v).__name__}")
    if any(k.startswith("dsaio.") for k in metadata):
        raise ValueError("save: metadata keys starting with 'dsaio.' are reserved for dsaio")
    return metadata


def _save(tensors: Mapping[str, Any], path: str, metadata: dict[str, str], engine: str | None,
          reserved_ok: bool) -> None:
    if not reserved_ok and any(k.startswith("dsaio.") for k in metadata):
        raise ValueError("save: metadata keys starting with 'dsaio.' are reserved for dsaio")
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save: expected a mapping of names to tensors, got {type(tensors).__name__}; "
                        "for nested state use dsaio.save_state_dict")
    prepared = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"save: tensor names must be strings other than '__metadata__', got {name!r}")
        try:
            code, shape, owner, addr, nbytes = host_bytes(value)
        except TypeError as exc:
            raise TypeError(f"save: {name!r}: {exc}") from None
        prepared.append((name, code, shape, owner, addr, nbytes))
    # Largest elements first, so every tensor starts on a multiple of its element size.
    prepared.sort(key=lambda p: (-DTYPES[p[1]][2], p[0]))
    pieces, pos = [], 0
    for name, code, shape, _owner, addr, nbytes in prepared:
        pieces.append((Entry(name, code, shape, pos, pos + nbytes), addr))
        pos += nbytes
    framework = "pt" if any(is_torch(v) for v in tensors.values()) else "np"
    write_atomic(path, pieces, metadata, framework, engine)
    del prepared  # the host copies (owners) lived until the bytes were on disk


def load(path: str | os.PathLike, device: str = "cpu", *, framework: str | None = None, verify: bool = True,
         engine: str | None = None) -> dict[str, Any]:
    """Reads a safetensors file (ours or anyone's) into a dict of tensors.

    `framework` "pt" gives torch tensors, "np" numpy arrays; by default what was saved (torch
    for files from other writers, when torch is installed). Tensors share one buffer.
    """
    tensors, _ = load_with_metadata(path, device, framework=framework, verify=verify, engine=engine)
    return tensors


def load_with_metadata(path: str | os.PathLike, device: str = "cpu", *, framework: str | None = None,
                       verify: bool = True, engine: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """`load`, plus the file's `__metadata__` as the caller saved it."""
    tensors, metadata = load_all(path, device, framework, verify, engine)
    return tensors, {k: v for k, v in metadata.items() if not k.startswith("dsaio.")}


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The caller's `__metadata__` of a safetensors file, from its header alone (no tensor data is read).

    The header is checked as `load` checks it (its layout against the file's size, dsaio's checksum over
    the metadata); the data's checksums are checked only when the data is read."""
    path = os.fspath(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        n = header_length(handle.read(8), path, size)
        raw = handle.read(n)
    if len(raw) != n:
        raise CheckpointError(path, f"truncated: the header should be {n} bytes, the file ends after {len(raw)}")
    metadata = decode_header(raw, path, size - 8 - n, verify=True).metadata
    return {k: v for k, v in metadata.items() if not k.startswith("dsaio.")}


def load_all(path: str | os.PathLike, device: str, framework: str | None, verify: bool,
             engine: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Tensors and every metadata entry, dsaio's own included."""
    if framework not in (None, "pt", "np"):
        raise ValueError(f"load: framework must be 'pt' or 'np', got {framework!r}")
    if framework == "np" and device != "cpu":
        raise ValueError(f"load: numpy arrays live on the CPU; device {device!r} needs framework='pt'")
    path = os.fspath(path)
    entries, metadata, data = read_file(path, verify, engine)
    chosen = framework or _stored_framework(metadata.get("dsaio.framework"), device)
    out: dict[str, Any] = {}
    for e in sorted(entries, key=lambda e: e.name):
        piece = data[e.begin : e.end]
        if chosen == "pt":
            t = as_torch(piece, e.dtype, e.shape)
            out[e.name] = t if device == "cpu" else t.to(device)
        elif DTYPES[e.dtype][0] is not None or framework == "np":
            out[e.name] = as_numpy(piece, e.dtype, e.shape, e.name)  # the caller's choice: its TypeError
        else:
            why = "the file says dsaio.framework 'np'" if metadata.get("dsaio.framework") == "np" else "torch is not installed"
            raise CheckpointError(path, f"tensor {e.name!r} is {e.dtype}, which numpy has no dtype for, and {why}; "
                                        "load it with framework='pt' (needs torch)")
    return out, metadata


def _stored_framework(stored: str | None, device: str) -> str:
    """What the file asks for (torch for other writers' files), where what it asks for is installed."""
    if stored == "np" and device == "cpu":
        return "np"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "np"
    return "pt"
