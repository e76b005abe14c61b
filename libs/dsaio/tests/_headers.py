"""Taking a checkpoint file apart and putting a changed header back, for the header tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import dsaio
from dsaio.checkpoint.format import Entry, index_crc, metadata_crc


def state_file(path: Path) -> Path:
    """A small state-dict file of numpy values only, so it is made and read without torch."""
    state = {"model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, np.float64)},
             "optimizer": {"state": {0: {"step": 3, "exp_avg": np.zeros(5, np.float16)}},
                           "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}]},
             "mask": np.array([True, False]), "ids": np.arange(7, dtype=np.int64), "best": float("inf"),
             "empty": np.empty((0, 4), np.int32), "tag": "run-1"}
    dsaio.save_state_dict(state, path)
    return path


def split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(path: Path, header: object, data: bytes, length: int | None = None) -> None:
    """Writes `header` (a JSON value, or the raw bytes of one) and `data`; `length` forges the prefix."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + data)


def resign(header: object) -> object:
    """Recomputes the index and metadata checksums where the header allows it, as a forger would, so
    the reader's own checks of each field are what refuses the file, not a checksum mismatch."""
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        return header
    meta = header["__metadata__"]
    try:
        entries = [Entry(k, v["dtype"], tuple(v["shape"]), *v["data_offsets"])
                   for k, v in header.items() if k != "__metadata__"]
        if len(meta.get("dsaio.index_crc32", "")) == 8:  # a value set by the test itself stays
            meta["dsaio.index_crc32"] = index_crc(entries)
    except Exception:  # a malformed entry: no checksum can be computed for it
        pass
    try:
        if len(meta.get("dsaio.metadata_crc32", "")) == 8:
            meta["dsaio.metadata_crc32"] = metadata_crc(meta)
    except Exception:
        pass
    return header
