"""The memory-mapped indexed format: what dsdata writes reads with a reader written from the format's
description, what that writer writes reads in dsdata, and a damaged file fails by name."""

import struct

import mmap_format
import numpy as np
import pytest
import torch

from dsdata import DataEfficiencyError, MMapIndexedDataset, MMapIndexedDatasetBuilder, find_fit_int_dtype
from dsdata.indexed_dataset import DTYPE_CODES, close_mmap_dataset_builder, create_mmap_dataset_builder


def test_deepspeed_dtype_codes():
    assert {code: str(dtype) for code, dtype in DTYPE_CODES.items()} == {
        1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "uint16", 7: "uint32", 8: "uint64"}


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64, np.uint16, np.uint32, torch.int64])
def test_written_files_read_with_the_format_description(tmp_path, dtype):
    prefix = tmp_path / "data"
    builder = create_mmap_dataset_builder(prefix, dtype)
    items = [[1, 2, 3], [], [7], list(range(40))]
    builder.add_item(torch.tensor(items[0]))
    builder.add_item_numpy(np.array(items[1], dtype=np.int64))
    builder.add_items([np.array(items[2]), np.array(items[3])])
    builder.add_scalars(np.array([5, 6]))
    builder.add_concatenated(np.array([9, 9, 8]), [2, 1])
    close_mmap_dataset_builder(builder, prefix)
    found_dtype, found, doc_idx = mmap_format.read(prefix)
    assert found_dtype == (np.dtype(np.int64) if dtype is torch.int64 else np.dtype(dtype))
    assert found == [*items, [5], [6], [9, 9], [8]]
    assert doc_idx == [0, 8]
    reader = MMapIndexedDataset(prefix)
    assert [reader[i].tolist() for i in range(len(reader))] == found
    assert reader.flat(3, 6).tolist() == [*range(40), 5, 6]
    assert reader.get(3, offset=5, length=2).tolist() == [5, 6] and reader[-1].tolist() == [8]
    assert [a.tolist() for a in reader[0:2]] == items[:2]


def test_files_of_the_format_description_read_in_dsdata(tmp_path):
    mmap_format.write(tmp_path / "x", [[3, 1], [4, 1, 5], [9]], code=7)
    reader = MMapIndexedDataset(tmp_path / "x")
    assert reader.dtype == np.uint32 and len(reader) == 3
    assert [reader[i].tolist() for i in range(3)] == [[3, 1], [4, 1, 5], [9]]
    assert reader.sizes.tolist() == [2, 3, 1] and reader.doc_idx.tolist() == [0, 3]


def test_merge_keeps_items_and_documents(tmp_path):
    for name, items in (("a", [[1], [2, 3]]), ("b", [[4]])):
        builder = create_mmap_dataset_builder(tmp_path / name, np.int32)
        builder.add_items([np.array(i) for i in items])
        close_mmap_dataset_builder(builder, tmp_path / name)
    merged = MMapIndexedDatasetBuilder(tmp_path / "m.bin", dtype=np.int32)
    merged.merge_file_(tmp_path / "a")
    merged.merge_file_(tmp_path / "b")
    merged.finalize(tmp_path / "m.idx")
    _, items, doc_idx = mmap_format.read(tmp_path / "m")
    assert items == [[1], [2, 3], [4]] and doc_idx == [0, 2, 3]


def test_find_fit_int_dtype():
    assert find_fit_int_dtype(0, 255) == np.uint8 and find_fit_int_dtype(0, 256) == np.uint16
    assert find_fit_int_dtype(-1, 127) == np.int8 and find_fit_int_dtype(-129, 0) == np.int16
    assert find_fit_int_dtype(0, 2**32) == np.uint64 and find_fit_int_dtype(-(2**31) - 1, 0) == np.int64


def _good(tmp_path):
    mmap_format.write(tmp_path / "g", [[1, 2], [3]], code=5)
    return tmp_path / "g"


@pytest.mark.parametrize(("damage", "message"), [
    (lambda idx, _: idx.write_bytes(b"NOTMAGIC" + idx.read_bytes()[8:]), "magic"),
    (lambda idx, _: idx.write_bytes(idx.read_bytes()[:-3]), "announces"),
    (lambda idx, _: idx.write_bytes(idx.read_bytes()[:17] + bytes([9]) + idx.read_bytes()[18:]), "dtype code 9"),
    (lambda idx, _: idx.write_bytes(idx.read_bytes()[:9] + struct.pack("<Q", 2) + idx.read_bytes()[17:]),
     "version 2"),
    (lambda _, data: data.write_bytes(data.read_bytes()[:-8]), "past the end"),
])
def test_damaged_files_fail_by_name(tmp_path, damage, message):
    prefix = _good(tmp_path)
    damage(tmp_path / "g.idx", tmp_path / "g.bin")
    with pytest.raises(DataEfficiencyError, match=message) as info:
        MMapIndexedDataset(prefix)
    assert "g." in str(info.value)


def test_missing_files_and_unsupported_dtypes(tmp_path):
    with pytest.raises(DataEfficiencyError, match="does not exist"):
        MMapIndexedDataset(tmp_path / "nothing")
    with pytest.raises(DataEfficiencyError, match="float32"):
        MMapIndexedDatasetBuilder(tmp_path / "f.bin", dtype=np.float32)


def _crafted(tmp_path, sizes, pointers, doc_idx, values=64, name="c"):
    """A .bin of `values` int64 values and an .idx that says what the test wants it to say."""
    prefix = tmp_path / name
    (prefix.parent / f"{name}.bin").write_bytes(np.arange(values, dtype="<i8").tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 5, len(sizes), len(doc_idx)))
        f.write(struct.pack(f"<{len(sizes)}i", *sizes))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack(f"<{len(doc_idx)}q", *doc_idx))
    return prefix


@pytest.mark.parametrize(("sizes", "pointers", "message"), [
    # pointer + size * 8 wraps past int64: item 1 used to load empty, and flat() returned two items' values
    ([8, 8, 8], [0, 2**63 - 8, 64], "item 1 starts at byte 9223372036854775800 of .*starts at byte 64"),
    ([8, 8, 8, 8], [0, 0, 0, 0], "item 1 starts at byte 0 .* starts at byte 64 \\(offsets that overlap"),
    ([1, 1], [0, 16], "item 1 starts at byte 16 .* starts at byte 8"),  # a gap flat() would read
    ([1, 1], [8, 16], "item 0 starts at byte 8 .* starts at byte 0"),
    ([2**31 - 1] * 5, [0, 17179869176 * 1, 17179869176 * 2, 17179869176 * 3, 17179869176 * 4],
     "the first 5 of 5 items take 85899345880 bytes, past the end"),
    ([4, -1], [0, 32], "item 1 has a negative length"),
])
def test_item_offsets_off_the_back_to_back_layout_are_refused(tmp_path, sizes, pointers, message):
    with pytest.raises(DataEfficiencyError, match=message) as info:
        MMapIndexedDataset(_crafted(tmp_path, sizes, pointers, [0, len(sizes)]))
    assert "c.idx" in str(info.value)


def test_overlapping_offsets_no_longer_shrink_what_the_sampler_sees(tmp_path):
    # 64 one-value items all pointing at value 0..3: flat() (what the sampler reads) saw 4 distinct samples.
    sizes, pointers = [1] * 64, [8 * (i % 4) for i in range(64)]
    with pytest.raises(DataEfficiencyError, match="back to back"):
        MMapIndexedDataset(_crafted(tmp_path, sizes, pointers, [0, 64]))


@pytest.mark.parametrize("doc_idx", [[], [1, 3], [0, 2, 1, 3], [0, 4], [-1, 3]])
def test_document_boundaries_are_checked(tmp_path, doc_idx):
    with pytest.raises(DataEfficiencyError, match="document boundaries"):
        MMapIndexedDataset(_crafted(tmp_path, [1, 1, 1], [0, 8, 16], doc_idx))


def test_well_formed_crafted_files_still_read(tmp_path):
    data = MMapIndexedDataset(_crafted(tmp_path, [2, 0, 3], [0, 16, 16], [0, 1, 3]))
    assert [data[i].tolist() for i in range(3)] == [[0, 1], [], [2, 3, 4]]
    assert data.flat().tolist() == [0, 1, 2, 3, 4] and data.doc_idx.tolist() == [0, 1, 3]


def test_the_layout_is_checked_across_chunks(tmp_path, monkeypatch):
    from dsdata import indexed_dataset

    monkeypatch.setattr(indexed_dataset, "CHECK_CHUNK", 2)  # as a dataset of millions of items is checked
    good = _crafted(tmp_path, [1, 2, 3, 4, 5], [0, 8, 24, 48, 80], [0, 5], name="good")
    assert MMapIndexedDataset(good).flat().tolist() == list(range(15))
    with pytest.raises(DataEfficiencyError, match=r"item 3 starts at byte 40 .* starts at byte 48"):
        MMapIndexedDataset(_crafted(tmp_path, [1, 2, 3, 4, 5], [0, 8, 24, 40, 80], [0, 5], name="bad"))
