"""The safetensors layout, and what dsaio adds to it so O_DIRECT and checks work.

    [u64 little-endian header length N][N bytes of JSON header][data]

dsaio pads the header with spaces (JSON allows them; so does safetensors) so the data starts on
a 4096-byte boundary and one direct read can load it all. Tensors are sorted by element size,
largest first, so each one is naturally aligned inside the data. `__metadata__` carries:
  dsaio.format      "1"
  dsaio.framework   "pt" or "np": what `load` gives back by default
  dsaio.chunk       checksum chunk size in bytes
  dsaio.crc32       8 hex digits (zlib CRC-32) per chunk of the data region
  dsaio.index_crc32 CRC-32 of the tensor index (names, dtypes, shapes, offsets)
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
_MAX_HEADER = 100 << 20  # safetensors' own limit

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


def encode_header(entries: list[Entry], metadata: dict[str, str]) -> bytes:
    """The length prefix and JSON header, padded with spaces to a HEADER_ALIGN boundary."""
    body: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    body.update((e.name, e.as_json()) for e in entries)
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    total = -(-(8 + len(raw)) // HEADER_ALIGN) * HEADER_ALIGN
    raw += b" " * (total - 8 - len(raw))
    return len(raw).to_bytes(8, "little") + raw


def header_length(prefix: bytes, path: str, file_size: int) -> int:
    if len(prefix) < 8:
        raise CheckpointError(path, f"truncated: {file_size} bytes is too short for a safetensors header")
    n = int.from_bytes(prefix[:8], "little")
    if n > _MAX_HEADER or 8 + n > file_size:
        raise CheckpointError(path, f"truncated or not a safetensors file: header length {n} "
                                    f"but the file has {file_size} bytes")
    return n


def decode_header(raw: bytes, path: str, data_size: int) -> tuple[list[Entry], dict[str, str]]:
    """Parses and checks the header against the size of the data region that follows it."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"corrupted header: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise CheckpointError(path, "corrupted header: not a JSON object")
    metadata = body.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(path, "corrupted header: __metadata__ must map strings to strings")
    entries = []
    for name, info in body.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            ok = dtype in DTYPES and all(isinstance(d, int) and d >= 0 for d in shape) and 0 <= begin <= end
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(path, f"corrupted header: bad entry for tensor {name!r}: {info!r}")
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][2]
        if end - begin != want:
            raise CheckpointError(path, f"corrupted header: tensor {name!r} of {dtype}{list(shape)} needs "
                                        f"{want} bytes, its offsets give {end - begin}")
        entries.append(Entry(name, dtype, shape, begin, end))
    entries.sort(key=lambda e: (e.begin, e.end))
    pos = 0
    for e in entries:
        if e.begin != pos:
            raise CheckpointError(path, f"corrupted header: tensor {e.name!r} starts at {e.begin}, expected {pos}")
        pos = e.end
    if pos != data_size:
        what = "truncated" if pos > data_size else "corrupted (trailing bytes)"
        raise CheckpointError(path, f"{what}: the header describes {pos} bytes of tensor data, "
                                    f"the file holds {data_size}")
    if "dsaio.index_crc32" in metadata and metadata["dsaio.index_crc32"] != index_crc(entries):
        raise CheckpointError(path, "corrupted header: the tensor index does not match its checksum")
    return entries, metadata
