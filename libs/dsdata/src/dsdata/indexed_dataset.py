"""DeepSpeed's (Megatron's) memory-mapped indexed dataset: a `.bin` file of items back to back and an
`.idx` file that says where each item starts, so files written here read in DeepSpeed and back.

`.idx`, little-endian: the magic b"MMIDIDX\\x00\\x00", version (u64, 1), dtype code (u8, the table
below), item count N (u64), document count D (u64), then N int32 item lengths, N int64 byte offsets
into `.bin`, and D int64 document boundaries. `.bin`: the items' values in that dtype, in order.

Reading checks every header field against the file sizes before use, every item offset against the
back-to-back layout the format writes (so `flat()` and every item read the same bytes; an offset that
overlaps, leaves a gap or wraps past int64 is refused) and the document boundaries: a truncated or
crafted file fails with DataEfficiencyError naming the file, never with a numpy error, a read past
the end, or silently wrong items.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataEfficiencyError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, item count, document count

# DeepSpeed's dtype codes (data_sampling/indexed_dataset.py); only integer types are defined.
DTYPE_CODES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16),
                                    4: np.dtype(np.int32), 5: np.dtype(np.int64), 6: np.dtype(np.uint16),
                                    7: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
_TORCH_NAMES = {"torch.uint8": np.uint8, "torch.int8": np.int8, "torch.int16": np.int16, "torch.int32": np.int32,
                "torch.int64": np.int64, "torch.uint16": np.uint16, "torch.uint32": np.uint32,
                "torch.uint64": np.uint64}


def as_numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of `dtype` (numpy or torch), if the format has a code for it."""
    if str(dtype) in _TORCH_NAMES:
        dtype = _TORCH_NAMES[str(dtype)]
    try:
        found = np.dtype(dtype)
    except TypeError:
        found = None
    if found is None or found not in DTYPE_CODES.values():
        names = ", ".join(str(d) for d in DTYPE_CODES.values())
        raise DataEfficiencyError(f"dtype {dtype} cannot be stored in an indexed dataset; supported: {names}")
    return found


def dtype_code(dtype: Any) -> int:
    found = as_numpy_dtype(dtype)
    return next(code for code, candidate in DTYPE_CODES.items() if candidate == found)


def find_fit_int_dtype(min_value: int, max_value: int) -> np.dtype:
    """The smallest integer dtype holding both values (unsigned when min_value >= 0), as DeepSpeed picks it."""
    candidates = (np.uint8, np.uint16, np.uint32, np.uint64) if min_value >= 0 else (np.int8, np.int16, np.int32,
                                                                                      np.int64)
    for candidate in candidates:
        info = np.iinfo(candidate)
        if info.min <= min_value and max_value <= info.max:
            return np.dtype(candidate)
    return np.dtype(candidates[-1])


def index_file_path(prefix: str | os.PathLike) -> str:
    return f"{os.fspath(prefix)}.idx"


def data_file_path(prefix: str | os.PathLike) -> str:
    return f"{os.fspath(prefix)}.bin"


def _as_array(item: Any) -> np.ndarray:
    return np.asarray(item.detach().cpu().numpy() if hasattr(item, "detach") else item)


class MMapIndexedDatasetBuilder:
    """Writes `out_file` (the `.bin`) item by item; `finalize(index_file)` writes the `.idx`."""

    def __init__(self, out_file: str | os.PathLike, dtype: Any = np.int64):
        self._dtype = as_numpy_dtype(dtype)
        self._path = os.fspath(out_file)
        self._data_file = open(self._path, "wb")  # noqa: SIM115 - closed by finalize()
        self._sizes: list[np.ndarray] = []  # chunks of item lengths, concatenated at finalize
        self._count = 0
        self._doc_idx = [0]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def add_item(self, tensor: Any) -> None:
        """One item: a tensor or array, flattened, converted to the builder's dtype."""
        array = _as_array(tensor).astype(self._dtype, copy=False).reshape(-1)
        self._data_file.write(array.tobytes(order="C"))
        self._append_sizes(np.array([array.size], dtype=np.int64))

    def add_item_numpy(self, np_array: np.ndarray) -> None:
        self.add_item(np_array)

    def add_items(self, arr_list: Iterable[Any]) -> None:
        for array in arr_list:
            self.add_item(array)

    def add_scalars(self, values: Any) -> None:
        """Each value of `values` as an item of length one (a per-sample metric), in one write."""
        array = _as_array(values).astype(self._dtype, copy=False).reshape(-1)
        self._data_file.write(array.tobytes(order="C"))
        self._append_sizes(np.ones(array.size, dtype=np.int64))

    def add_concatenated(self, values: Any, sizes: Any) -> None:
        """Items given back to back in `values`, of lengths `sizes`, in one write."""
        array = _as_array(values).astype(self._dtype, copy=False).reshape(-1)
        lengths = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if lengths.sum() != array.size or (lengths < 0).any():
            raise DataEfficiencyError(f"{self._path}: item lengths sum to {int(lengths.sum())} but {array.size} "
                                      f"values were given")
        self._data_file.write(array.tobytes(order="C"))
        self._append_sizes(lengths)

    def end_document(self) -> None:
        self._doc_idx.append(self._count)

    def merge_file_(self, another_file: str | os.PathLike) -> None:
        """Append the items of the dataset at prefix `another_file` (same dtype), as one more document each
        of its documents."""
        other = MMapIndexedDataset(another_file, skip_warmup=True)
        if other.dtype != self._dtype:
            raise DataEfficiencyError(f"{another_file}: dtype {other.dtype} differs from the builder's {self._dtype}")
        offset = self._count
        self._append_sizes(np.asarray(other.sizes, dtype=np.int64))
        self._doc_idx.extend(int(d) + offset for d in other.doc_idx[1:])
        with open(data_file_path(another_file), "rb") as source:
            shutil.copyfileobj(source, self._data_file)

    def finalize(self, index_file: str | os.PathLike) -> None:
        self._data_file.close()
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, dtype=np.int64)
        write_index(index_file, self._dtype, sizes, self._doc_idx)

    def _append_sizes(self, lengths: np.ndarray) -> None:
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise DataEfficiencyError(f"{self._path}: an item of {int(lengths.max())} values is longer than the "
                                      f"format's int32 length field")
        self._sizes.append(lengths)
        self._count += lengths.size


def write_index(index_file: str | os.PathLike, dtype: Any, sizes: np.ndarray, doc_idx: Iterable[int]) -> None:
    """The `.idx` bytes for items of `sizes` values of `dtype`, stored back to back."""
    np_dtype = as_numpy_dtype(dtype)
    lengths = np.asarray(sizes, dtype=np.int64)
    pointers = np.zeros(lengths.size, dtype=np.int64)
    if lengths.size > 1:
        np.cumsum(lengths[:-1] * np_dtype.itemsize, out=pointers[1:])
    documents = np.asarray(list(doc_idx), dtype=np.int64)
    with open(index_file, "wb") as out:
        out.write(_HEADER.pack(MAGIC, VERSION, dtype_code(np_dtype), lengths.size, documents.size))
        out.write(lengths.astype("<i4").tobytes())
        out.write(pointers.astype("<i8").tobytes())
        out.write(documents.astype("<i8").tobytes())


def _map(path: str, dtype: Any = np.uint8) -> np.ndarray:
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=dtype)  # mmap refuses empty files
    return np.memmap(path, dtype=dtype, mode="r", order="C")


class MMapIndexedDataset:
    """Read-only items of the dataset at `path` (the prefix of `path.idx` and `path.bin`); item `i` is a
    numpy array viewing the mapped `.bin`. `skip_warmup` is accepted for DeepSpeed's signature: the
    files are mapped, not read ahead."""

    def __init__(self, path: str | os.PathLike, skip_warmup: bool = False):
        self._path = os.fspath(path)
        index, data = index_file_path(self._path), data_file_path(self._path)
        for name in (index, data):
            if not os.path.isfile(name):
                raise DataEfficiencyError(f"indexed dataset {self._path}: {name} does not exist (a dataset is a "
                                          f"prefix with .idx and .bin files)")
        self._dtype, self._sizes, self._pointers, self._doc_idx = _read_index(index)
        self._data = _map(data)
        _check_layout(index, data, self._dtype, self._sizes, self._pointers, self._doc_idx, self._data.size)

    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        return os.path.isfile(index_file_path(path)) and os.path.isfile(data_file_path(path))

    def __len__(self) -> int:
        return int(self._sizes.size)

    def __getitem__(self, idx: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise DataEfficiencyError(f"{self._path}: slices of an indexed dataset must be contiguous (step 1)")
            return [self.get(i) for i in range(start, stop)]
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Item `idx`, or `length` of its values from `offset`."""
        index = int(idx)
        if not -len(self) <= index < len(self):
            raise IndexError(f"{self._path}: item {idx} out of range for {len(self)} items")
        size = int(self._sizes[index])
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"{self._path}: values {offset}..{offset + length} out of item {idx}'s {size}")
        start = int(self._pointers[index]) + offset * self._dtype.itemsize
        return self._data[start:start + length * self._dtype.itemsize].view(self._dtype)

    def flat(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Items start..stop back to back, as one array (they are stored contiguously)."""
        stop = len(self) if stop is None else stop
        if start >= stop:
            return np.zeros(0, dtype=self._dtype)
        first = int(self._pointers[start])
        end = int(self._pointers[stop - 1]) + int(self._sizes[stop - 1]) * self._dtype.itemsize
        return self._data[first:end].view(self._dtype)

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    def size(self, index: int) -> int:
        return int(self._sizes[index])

    @property
    def doc_idx(self) -> np.ndarray:
        return self._doc_idx

    def get_doc_idx(self) -> np.ndarray:
        return self._doc_idx

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def supports_prefetch(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"MMapIndexedDataset({self._path!r}, {len(self)} items of {self._dtype})"


def _read_index(path: str) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    file_size = os.path.getsize(path)
    with open(path, "rb") as stream:
        header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size or not header.startswith(MAGIC):
        raise DataEfficiencyError(f"{path}: not a memory-mapped indexed dataset index (expected the magic "
                                  f"{MAGIC!r} and a {_HEADER.size}-byte header)")
    _, version, code, count, documents = _HEADER.unpack(header)
    if version != VERSION:
        raise DataEfficiencyError(f"{path}: index version {version}; only version {VERSION} is defined")
    if code not in DTYPE_CODES:
        raise DataEfficiencyError(f"{path}: dtype code {code} is not one of DeepSpeed's {sorted(DTYPE_CODES)}")
    expected = _HEADER.size + count * (4 + 8) + documents * 8
    if expected != file_size:
        raise DataEfficiencyError(f"{path}: the header announces {count} items and {documents} document "
                                  f"boundaries ({expected} bytes) but the file has {file_size} bytes")
    mapped = _map(path)
    sizes = mapped[_HEADER.size:_HEADER.size + 4 * count].view("<i4")
    pointers = mapped[_HEADER.size + 4 * count:_HEADER.size + 12 * count].view("<i8")
    doc_idx = mapped[_HEADER.size + 12 * count:].view("<i8")
    return DTYPE_CODES[code], sizes, pointers, doc_idx


CHECK_CHUNK = 1 << 22  # items checked at a time: a few arrays of this many int64, whatever the dataset's size


def _check_layout(index: str, data: str, dtype: np.dtype, sizes: np.ndarray, pointers: np.ndarray,
                  doc_idx: np.ndarray, data_bytes: int) -> None:
    """Every item where the format puts it: back to back from byte 0 (what `flat()` and the sampler read),
    within the `.bin`; document boundaries ascending within the items. Checked in whole-array steps."""
    count = int(sizes.size)
    if count and int(sizes.min()) < 0:
        raise DataEfficiencyError(f"{index}: item {int(np.argmax(sizes < 0))} has a negative length "
                                  f"({int(sizes.min())})")
    offset = 0  # where the next item starts; a stretch adds at most CHECK_CHUNK * 2**34 bytes: no int64 overflow
    for begin in range(0, count, CHECK_CHUNK):
        lengths = sizes[begin:begin + CHECK_CHUNK].astype(np.int64) * dtype.itemsize
        ends = np.cumsum(lengths) + offset
        misplaced = np.flatnonzero(pointers[begin:begin + CHECK_CHUNK] != ends - lengths)
        if misplaced.size:
            item = begin + int(misplaced[0])
            raise DataEfficiencyError(
                f"{index}: item {item} starts at byte {int(pointers[item])} of {data}, but items are stored back to "
                f"back, so it starts at byte {int(ends[misplaced[0]] - lengths[misplaced[0]])} (offsets that "
                f"overlap, leave gaps or overflow are refused)")
        offset = int(ends[-1])
        if offset > data_bytes:
            raise DataEfficiencyError(f"{index}: the first {begin + lengths.size} of {count} items take {offset} "
                                      f"bytes, past the end of {data} ({data_bytes} bytes)")
    if doc_idx.size == 0:
        raise DataEfficiencyError(f"{index}: no document boundaries (the format starts them with 0)")
    if int(doc_idx[0]) != 0 or bool((np.diff(doc_idx) < 0).any()) or int(doc_idx[-1]) > count:
        raise DataEfficiencyError(f"{index}: document boundaries must start at 0 and ascend to at most the item "
                                  f"count ({count}); they are {_preview(doc_idx)}")


def _preview(values: np.ndarray, limit: int = 8) -> str:
    shown = ", ".join(str(int(v)) for v in values[:limit])
    return f"[{shown}{', ...' if values.size > limit else ''}] ({values.size} values)"


def create_mmap_dataset_builder(fname: str | os.PathLike, dtype: Any) -> MMapIndexedDatasetBuilder:
    """A builder writing `fname.bin` (DeepSpeed's helper of the same name)."""
    Path(data_file_path(fname)).parent.mkdir(parents=True, exist_ok=True)
    return MMapIndexedDatasetBuilder(data_file_path(fname), dtype=dtype)


def close_mmap_dataset_builder(builder: MMapIndexedDatasetBuilder, fname: str | os.PathLike) -> None:
    """End the one document and write `fname.idx`."""
    builder.end_document()
    builder.finalize(index_file_path(fname))
