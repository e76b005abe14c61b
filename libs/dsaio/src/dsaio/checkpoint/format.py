"""The safetensors layout, and what dsaio adds to it so O_DIRECT and checks work.

    [u64 little-endian header length N][N bytes of JSON header][data]

dsaio pads the header with spaces (JSON allows them; so does safetensors) so the data starts on
a 4096-byte boundary and one direct read can load it all. Tensors are sorted by element size,
largest first, so each one is naturally aligned inside the data. `__metadata__` carries:
  dsaio.format         "2" ("1": files written before dsaio.metadata_crc32 existed)
  dsaio.framework      "pt" or "np": what `load` gives back by default
  dsaio.chunk          checksum chunk size in bytes
  dsaio.crc32          8 hex digits (zlib CRC-32) per chunk of the data region
  dsaio.index_crc32    CRC-32 of the tensor index (names, dtypes, shapes, offsets)
  dsaio.metadata_crc32 CRC-32 of every other metadata entry (the caller's and dsaio.state among them)

Reading a header that may be hostile is header.py's job.
"""

from __future__ import annotations

import errno
import json
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import AioError

HEADER_ALIGN = 4096
CHUNK = 64 << 20  # checksum and streaming unit: big enough for full-speed I/O, small enough to overlap
MAX_HEADER = 100 << 20  # safetensors' own limit
FORMAT = "2"
# Checksums each format version carries; a file of ours without one of them is refused.
REQUIRED = {"1": ("dsaio.chunk", "dsaio.crc32", "dsaio.index_crc32"),
            "2": ("dsaio.chunk", "dsaio.crc32", "dsaio.index_crc32", "dsaio.metadata_crc32")}
_NOT_IN_METADATA_CRC = ("dsaio.crc32", "dsaio.metadata_crc32")  # the data's CRCs land after the rest is fixed

# safetensors dtype code -> (numpy dtype or None where numpy has none, torch dtype name, bytes)
DTYPES: dict[str, tuple[np.dtype | None, str, int]] = {
    "BOOL": (np.dtype(np.bool_), "bool", 1),
    "U8": (np.dtype(np.uint8), "uint8", 1),
    "I8": (np.dtype(np.int8), "int8", 1),
    "F8_E4M3": (None, "float8_e4m3fn", 1),
    "F8_E5M2": (None, "float8_e5m2", 1),
    "I16": (np.dtype(np.int16), "int16", 2),
    "U16": (np.dtype(np.uint16), "uint16", 2),
    "F16": (np.dtype(np.float16), "float16", 2),
    "BF16": (None, "bfloat16", 2),
    "I32": (np.dtype(np.int32), "int32", 4),
    "U32": (np.dtype(np.uint32), "uint32", 4),
    "F32": (np.dtype(np.float32), "float32", 4),
    "C64": (np.dtype(np.complex64), "complex64", 8),
    "F64": (np.dtype(np.float64), "float64", 8),
    "I64": (np.dtype(np.int64), "int64", 8),
    "U64": (np.dtype(np.uint64), "uint64", 8),
}
_BY_TORCH = {v[1]: k for k, v in DTYPES.items()}


class CheckpointError(AioError):
    """A checkpoint file is not what it should be: truncated, corrupted, or not one of ours."""

    def __init__(self, path: str, detail: str, err: int = errno.EINVAL) -> None:
        super().__init__(err, path, "checkpoint", detail)


def dtype_code(obj: object) -> str:
    """The safetensors code for a numpy array's or torch tensor's dtype."""
    if isinstance(obj, np.ndarray):
        for code, (np_dtype, _, _) in DTYPES.items():
            if np_dtype is not None and np_dtype == obj.dtype:  # != for the other byte order
                return code
        raise TypeError(f"numpy dtype {obj.dtype} cannot be stored in a safetensors file")
    name = str(obj.dtype).removeprefix("torch.")
    if name not in _BY_TORCH:
        raise TypeError(f"torch dtype {obj.dtype} cannot be stored in a safetensors file")
    return _BY_TORCH[name]


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    def as_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "data_offsets": [self.begin, self.end]}


def index_crc(entries: list[Entry]) -> str:
    text = json.dumps([[e.name, e.dtype, list(e.shape), e.begin, e.end] for e in sorted(entries, key=lambda e: e.name)],
                      separators=(",", ":"))
    return f"{zlib.crc32(text.encode()):08x}"


def metadata_crc(metadata: dict[str, str]) -> str:
    covered = sorted((k, v) for k, v in metadata.items() if k not in _NOT_IN_METADATA_CRC)
    return f"{zlib.crc32(json.dumps(covered, separators=(',', ':')).encode()):08x}"


def encode_header(entries: list[Entry], metadata: dict[str, str]) -> bytes:
    """The length prefix and JSON header, padded with spaces to a HEADER_ALIGN boundary."""
    body: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    body.update((e.name, e.as_json()) for e in entries)
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    total = -(-(8 + len(raw)) // HEADER_ALIGN) * HEADER_ALIGN
    raw += b" " * (total - 8 - len(raw))
    return len(raw).to_bytes(8, "little") + raw
