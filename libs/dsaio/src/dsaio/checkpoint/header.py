"""Reading a checkpoint header that may be hostile.

Every field is checked for type and range before anything uses it, and every failure is a
CheckpointError naming the field and saying what would be valid: no crafted value may reach numpy,
torch or Python's arithmetic and make them raise something else. Nothing in a header is executed
or unpickled. The checksums a dsaio file carries are required: deleting one does not turn
verification off (`verify=False` does, on the caller's request).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from .format import DTYPES, MAX_HEADER, REQUIRED, CheckpointError, Entry, index_crc, metadata_crc

MAX_DIMS = 32  # numpy 1.x's limit (2.x allows 64); no real tensor comes near it
MAX_BYTES = (1 << 63) - 1  # sizes and strides must fit the signed 64-bit arithmetic of numpy and torch
MIN_CHUNK, MAX_CHUNK = 4096, 1 << 40
FIELDS = ("dtype", "shape", "data_offsets")
_HEX8 = re.compile(r"[0-9a-f]{8}")
_CRCS = re.compile(r"(?:[0-9a-f]{8})*")
_CHUNK = re.compile(r"[1-9][0-9]{0,15}")
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlevel, _repr.maxlist, _repr.maxdict = 60, 60, 3, 6, 4


@dataclass(frozen=True)
class Header:
    entries: list[Entry]  # in file order
    metadata: dict[str, str]
    chunk: int  # bytes per data checksum
    crcs: list[str] | None  # one per chunk; None when nothing is verified (verify off, or another writer's file)


def show(value: Any) -> str:
    """A hostile value, quoted briefly enough for a message."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        return _repr.repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {show(twice)}")  # readers would disagree on which one counts
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, path: str, what: str) -> Any:
    """json.loads, refusing duplicate keys and NaN/Infinity, with every failure a CheckpointError."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError:
        raise CheckpointError(path, f"corrupted header: {what} is nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, and integers of more than 4300 digits
        raise CheckpointError(path, f"corrupted header: {what} is not valid JSON ({str(exc)[:200]})") from None


def header_length(prefix: bytes, path: str, file_size: int) -> int:
    if len(prefix) < 8:
        raise CheckpointError(path, f"truncated: {file_size} bytes is too short for a safetensors header")
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER or 8 + n > file_size:
        raise CheckpointError(path, f"truncated or not a safetensors file: header length {n} "
                                    f"but the file has {file_size} bytes (headers are at most {MAX_HEADER})")
    return n


def decode_header(raw: bytes, path: str, data_size: int, verify: bool) -> Header:
    """Parses the header and checks it against the size of the data region that follows it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(path, f"corrupted header: not valid JSON (not UTF-8: {exc.reason} at byte "
                                    f"{8 + exc.start})") from None
    body = parse_json(text, path, "the header")
    if not isinstance(body, dict):
        raise CheckpointError(path, f"corrupted header: not a JSON object but {show(body)}")
    metadata = _metadata(body.pop("__metadata__", None), path)
    entries = sorted((_entry(name, info, path) for name, info in body.items()), key=lambda e: (e.begin, e.end))
    _check_layout(entries, path, data_size)
    chunk, crcs = _checksums(metadata, entries, path, data_size, verify)
    return Header(entries, metadata, chunk, crcs)


def _metadata(raw: Any, path: str) -> dict[str, str]:
    if raw is None:  # safetensors writes no __metadata__ when there is none
        return {}
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"corrupted header: __metadata__ must be an object of strings, got {show(raw)}")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise CheckpointError(path, f"corrupted header: __metadata__ must map strings to strings; "
                                        f"{show(key)} holds {show(value)}")
    return raw


def _is_size(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_BYTES  # not bool, not float


def _entry(name: str, info: Any, path: str) -> Entry:
    where = f"corrupted header: tensor {show(name)}"
    if not isinstance(info, dict):
        raise CheckpointError(path, f"{where} must be an object with dtype, shape and data_offsets, got {show(info)}")
    missing = [f for f in FIELDS if f not in info]
    extra = [k for k in info if k not in FIELDS]
    if missing or extra:
        what = "; ".join(filter(None, [missing and f"no {', '.join(missing)}",
                                       extra and f"unexpected field {', '.join(map(show, extra))}"]))
        raise CheckpointError(path, f"{where} has {what}; expected exactly dtype, shape and data_offsets")
    dtype, shape, offsets = (info[f] for f in FIELDS)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(path, f"{where}: dtype {show(dtype)} is not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_size(d) for d in shape):
        raise CheckpointError(path, f"{where}: shape {show(shape)} must be a list of at most {MAX_DIMS} "
                                    f"non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_size(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise CheckpointError(path, f"{where}: data_offsets {show(offsets)} must be [begin, end], integers with "
                                    f"0 <= begin <= end")
    itemsize = DTYPES[dtype][2]
    # Strides multiply every dimension but zeros: they too must fit in 64 bits, even for an empty tensor.
    if math.prod(max(d, 1) for d in shape) * itemsize > MAX_BYTES:
        raise CheckpointError(path, f"{where}: shape {show(shape)} of {dtype} is larger than any tensor can be "
                                    f"({MAX_BYTES} bytes)")
    nbytes = math.prod(shape) * itemsize
    begin, end = offsets
    if end - begin != nbytes:
        raise CheckpointError(path, f"{where}: shape {shape} of {dtype} needs {nbytes} bytes, its data_offsets "
                                    f"{offsets} hold {end - begin}")
    return Entry(name, dtype, tuple(shape), begin, end)


def _check_layout(entries: list[Entry], path: str, data_size: int) -> None:
    """Tensors lie end to end from the start of the data, no gap, no overlap, nothing past the file."""
    pos = 0
    for e in entries:
        if e.begin != pos:
            raise CheckpointError(path, f"corrupted header: tensor {show(e.name)} starts at {e.begin}, expected {pos} "
                                        f"(data_offsets must tile the data region with no gap or overlap)")
        pos = e.end
    if pos != data_size:
        what = "truncated" if pos > data_size else "corrupted (trailing bytes)"
        raise CheckpointError(path, f"{what}: the header describes {pos} bytes of tensor data, "
                                    f"the file holds {data_size}")


def _checksums(metadata: dict[str, str], entries: list[Entry], path: str, data_size: int,
               verify: bool) -> tuple[int, list[str] | None]:
    """dsaio's own metadata, checked; (chunk, data CRCs) to verify the data against."""
    if not any(k.startswith("dsaio.") for k in metadata):
        return max(data_size, 1), None  # another writer's safetensors file: it carries no checksums
    fmt = metadata.get("dsaio.format")
    if fmt not in REQUIRED:
        raise CheckpointError(path, f"corrupted header: dsaio.format is {'missing' if fmt is None else show(fmt)}; "
                                    f"this dsaio reads format {' or '.join(REQUIRED)}")
    framework = metadata.get("dsaio.framework")
    if framework is not None and framework not in ("pt", "np"):
        raise CheckpointError(path, f"corrupted header: dsaio.framework is {show(framework)}, expected 'pt' or 'np'")
    missing = [k for k in REQUIRED[fmt] if k not in metadata]
    if missing and verify:
        raise CheckpointError(path, f"corrupted header: {', '.join(missing)} missing; a dsaio file of format {fmt} "
                                    f"carries {', '.join(REQUIRED[fmt])} (verify=False reads it unchecked)")
    chunk = _chunk(metadata["dsaio.chunk"], path) if "dsaio.chunk" in metadata else max(data_size, 1)
    crcs = None
    if "dsaio.crc32" in metadata:
        text, count = metadata["dsaio.crc32"], -(-data_size // chunk)
        if len(text) != 8 * count or not _CRCS.fullmatch(text):
            raise CheckpointError(path, f"corrupted header: dsaio.crc32 must hold {count} CRC-32s of 8 lowercase hex "
                                        f"digits (one per {chunk}-byte chunk of {data_size} bytes), got "
                                        f"{len(text)} characters {show(text)}")
        crcs = [text[i : i + 8] for i in range(0, len(text), 8)]
    for key, what, expected in (("dsaio.index_crc32", "the tensor index (names, dtypes, shapes, offsets)",
                                 lambda: index_crc(entries)),
                                ("dsaio.metadata_crc32", "the metadata", lambda: metadata_crc(metadata))):
        if key not in metadata:
            continue
        if not _HEX8.fullmatch(metadata[key]):
            raise CheckpointError(path, f"corrupted header: {key} is {show(metadata[key])}, expected 8 lowercase "
                                        f"hex digits")
        if verify and metadata[key] != expected():
            raise CheckpointError(path, f"corrupted header: {what} does not match its checksum {key}")
    return chunk, crcs if verify else None


def _chunk(text: str, path: str) -> int:
    if not _CHUNK.fullmatch(text) or not MIN_CHUNK <= int(text) <= MAX_CHUNK or int(text) % MIN_CHUNK:
        raise CheckpointError(path, f"corrupted header: dsaio.chunk is {show(text)}, expected a decimal number of "
                                    f"bytes, a multiple of {MIN_CHUNK} from {MIN_CHUNK} to {MAX_CHUNK}")
    return int(text)
