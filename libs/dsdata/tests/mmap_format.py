"""A reader and a writer of DeepSpeed's memory-mapped indexed format written from its description alone
(magic, u64 version 1, u8 dtype code, u64 items, u64 documents, int32 lengths, int64 byte offsets,
int64 document boundaries; the .bin holds the values), independent of dsdata's code."""

import struct

import numpy as np

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16, 7: np.uint32, 8: np.uint64}


def read(prefix):
    """(dtype, [items], doc_idx) of the dataset at `prefix`."""
    with open(f"{prefix}.idx", "rb") as f:
        raw = f.read()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, count, docs = struct.unpack_from("<QBQQ", raw, 9)
    assert version == 1
    offset = 9 + 8 + 1 + 8 + 8
    sizes = struct.unpack_from(f"<{count}i", raw, offset)
    pointers = struct.unpack_from(f"<{count}q", raw, offset + 4 * count)
    doc_idx = list(struct.unpack_from(f"<{docs}q", raw, offset + 12 * count))
    dtype = np.dtype(CODES[code])
    with open(f"{prefix}.bin", "rb") as f:
        data = f.read()
    items = [np.frombuffer(data, dtype=dtype, count=size, offset=pointer).tolist()
             for size, pointer in zip(sizes, pointers)]
    return dtype, items, doc_idx


def write(prefix, items, code):
    dtype = np.dtype(CODES[code])
    arrays = [np.asarray(item, dtype=dtype) for item in items]
    with open(f"{prefix}.bin", "wb") as f:
        for array in arrays:
            f.write(array.tobytes())
    sizes = [a.size for a in arrays]
    pointers, position = [], 0
    for size in sizes:
        pointers.append(position)
        position += size * dtype.itemsize
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(items), 2))
        f.write(struct.pack(f"<{len(sizes)}i", *sizes))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack("<2q", 0, len(items)))
