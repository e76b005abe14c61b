"""Every field of a checkpoint header is checked before it is used: a crafted header fails with a
CheckpointError that names the field, never with another exception from deeper down."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _headers import join, resign, split, state_file

import dsaio


def _set(key: str, value: object):
    def change(h):
        h[key] = value
    return change


def _meta(key: str, value: object = None, delete: bool = False):
    def change(h):
        if delete:
            del h["__metadata__"][key]
        else:
            h["__metadata__"][key] = value
    return change


def _entry(field: str, value: object, name: str = "model.w"):
    def change(h):
        h[name][field] = value
    return change


def _two_entries(change_pair):
    def change(h):
        a, b = (h[k] for k in ("model.b", "model.w"))
        change_pair(a, b)
    return change


def _overlap(a, b):
    b["data_offsets"] = [a["data_offsets"][0] + 8, a["data_offsets"][0] + 8 + 48]


def _state(value: object):
    def change(h):
        h["__metadata__"]["dsaio.state"] = value if isinstance(value, str) else json.dumps(value)
    return change


def _nested(depth: int) -> object:
    node: object = 1
    for _ in range(depth):
        node = [node]
    return node


# (id, change to the parsed header, words the message must contain). Checksums are recomputed after
# each change, so the field's own check is what must refuse it.
CASES = [
    ("metadata-list", _set("__metadata__", ["a"]), "__metadata__"),
    ("metadata-int-value", _meta("step", 3), "__metadata__"),
    ("entry-not-object", _set("model.w", [1, 2]), "'model.w'"),
    ("entry-missing-dtype", lambda h: h["model.w"].pop("dtype"), "dtype"),
    ("entry-extra-field", _entry("pickle", "x"), "pickle"),
    ("dtype-unknown", _entry("dtype", "F128"), "dtype"),
    ("dtype-not-string", _entry("dtype", ["F32"]), "dtype"),
    ("dtype-null", _entry("dtype", None), "dtype"),
    ("shape-string", _entry("shape", "12"), "shape"),
    ("shape-negative", _entry("shape", [-3, -4]), "shape"),
    ("shape-bool", _entry("shape", [True, 12]), "shape"),
    ("shape-float", _entry("shape", [3.0, 4.0]), "shape"),
    ("shape-too-many-dims", _entry("shape", [1] * 40 + [12]), "shape"),
    ("shape-product-wraps-int64", _entry("shape", [2**32, 2**32, 0 + 1]), "shape"),
    ("shape-huge-with-zero", lambda h: h["empty"].update(shape=[0, 2**62, 2**62]), "shape"),
    ("shape-dim-2^64", _entry("shape", [2**64]), "shape"),
    ("offsets-not-pair", _entry("data_offsets", [0]), "data_offsets"),
    ("offsets-float", _entry("data_offsets", [0.0, 48.0]), "data_offsets"),
    ("offsets-bool", _entry("data_offsets", [False, True]), "data_offsets"),
    ("offsets-negative", _entry("data_offsets", [-48, 0]), "data_offsets"),
    ("offsets-reversed", _entry("data_offsets", [48, 0]), "data_offsets"),
    ("offsets-string", _entry("data_offsets", "0,48"), "data_offsets"),
    ("offsets-overlap", _two_entries(_overlap), "starts at"),
    ("offsets-past-the-file", lambda h: h["model.b"].update(data_offsets=[10**12, 10**12 + 24]), "starts at"),
    ("chunk-zero", _meta("dsaio.chunk", "0"), "dsaio.chunk"),
    ("chunk-negative", _meta("dsaio.chunk", "-4096"), "dsaio.chunk"),
    ("chunk-words", _meta("dsaio.chunk", "sixty-four MiB"), "dsaio.chunk"),
    ("chunk-underscores", _meta("dsaio.chunk", "67_108_864"), "dsaio.chunk"),
    ("chunk-unaligned", _meta("dsaio.chunk", "4097"), "dsaio.chunk"),
    ("chunk-5000-digits", _meta("dsaio.chunk", "9" * 5000), "dsaio.chunk"),
    ("chunk-missing", _meta("dsaio.chunk", delete=True), "dsaio.chunk"),
    ("crc32-missing", _meta("dsaio.crc32", delete=True), "dsaio.crc32"),
    ("crc32-not-hex", lambda h: h["__metadata__"].update({"dsaio.crc32": "zz" * 4}), "dsaio.crc32"),
    ("crc32-wrong-count", lambda h: h["__metadata__"].update({"dsaio.crc32": "0" * 16}), "dsaio.crc32"),
    ("index-crc-missing", _meta("dsaio.index_crc32", delete=True), "dsaio.index_crc32"),
    ("index-crc-not-hex", _meta("dsaio.index_crc32", "not hex"), "dsaio.index_crc32"),
    ("metadata-crc-missing", _meta("dsaio.metadata_crc32", delete=True), "dsaio.metadata_crc32"),
    ("format-missing", _meta("dsaio.format", delete=True), "dsaio.format"),
    ("format-unknown", _meta("dsaio.format", "99"), "dsaio.format"),
    ("framework-unknown", _meta("dsaio.framework", "tf"), "dsaio.framework"),
    ("state-not-json", _state("{not json"), "dsaio.state"),
    ("state-deep-json", _state("[" * 100_000 + "]" * 100_000), "dsaio.state"),
    ("state-too-deep", _state(_nested(300)), "dsaio.state"),
    ("state-huge-int", _state("[" + "9" * 5000 + "]"), "dsaio.state"),
    ("state-nan", _state("[NaN]"), "dsaio.state"),
    ("state-float-words", _state({"__float__": "__import__('os')"}), "__float__"),
    ("state-dict-not-pairs", _state({"__dict__": [[1]]}), "__dict__"),
    ("state-dict-items-not-list", _state({"__dict__": 5}), "__dict__"),
    ("state-dict-list-key", _state({"__dict__": [[[1, 2], 3]]}), "key"),
    ("state-tensor-name-list", _state({"__tensor__": ["model.w"]}), "__tensor__"),
    ("state-tensor-missing", _state({"__tensor__": "nope"}), "nope"),
    ("state-set-list-member", _state({"__set__": [[1]]}), "__set__"),
    ("state-tuple-not-list", _state({"__tuple__": 5}), "__tuple__"),
    ("state-two-tags", _state({"__tuple__": [], "__set__": []}), "dsaio.state"),
    ("state-unknown-tag", _state({"__pickle__": "gASV"}), "__pickle__"),
    ("state-bytes-not-hex", _state({"__bytes__": 12}), "__bytes__"),
    ("state-namespace-not-dict", _state({"__namespace__": [1]}), "__namespace__"),
    ("state-namespace-int-names", _state({"__namespace__": {"__dict__": [[1, 2]]}}), "__namespace__"),
]


@pytest.mark.parametrize("case, change, words", CASES, ids=[c[0] for c in CASES])
def test_crafted_field_is_refused_naming_it(tmp_path, case, change, words):
    path = state_file(tmp_path / "s.safetensors")
    header, data = split(path)
    change(header)
    join(path, resign(header), data)
    with pytest.raises(dsaio.CheckpointError) as info:
        dsaio.load_state_dict(path)
    assert words in str(info.value), str(info.value)
    assert info.value.filename == str(path)
    if not case.startswith("state"):  # a flat load reads the same header
        with pytest.raises(dsaio.CheckpointError, match=r"corrupted|truncated"):
            dsaio.load(path)


@pytest.mark.parametrize("name", ["onnx", "load", "__import__", "float32 ", "Tensor"])
def test_torch_dtype_names_are_looked_up_not_imported(tmp_path, name):
    pytest.importorskip("torch")
    path = state_file(tmp_path / "s.safetensors")
    header, data = split(path)
    _state({"__torch_dtype__": name})(header)
    join(path, resign(header), data)
    with pytest.raises(dsaio.CheckpointError, match="__torch_dtype__"):
        dsaio.load_state_dict(path)


RAW = [
    ("length-2^64", lambda h: (h, 2**64 - 1), "header length"),
    ("length-zero", lambda h: (h, 0), "not valid JSON"),
    ("not-utf8", lambda h: (b"\xff\xfe" + b" " * 30, None), "not valid JSON"),
    ("json-array", lambda h: (b"[1, 2]", None), "not a JSON object"),
    ("duplicate-key", lambda h: (b'{"a": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]},'
                                 b' "a": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}', None), "duplicate"),
    ("nan", lambda h: (b'{"a": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 0]}}', None), "NaN"),
    ("deep", lambda h: (b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", None), "nested"),
    ("huge-int", lambda h: (b'{"a": {"dtype": "U8", "shape": [' + b"1" * 5000 + b'], "data_offsets": [0, 0]}}', None),
     "not valid JSON"),
]


@pytest.mark.parametrize("change, words", [c[1:] for c in RAW], ids=[c[0] for c in RAW])
def test_crafted_header_bytes_are_refused(tmp_path, change, words):
    path = state_file(tmp_path / "s.safetensors")
    header, data = split(path)
    text, length = change(header)
    join(path, text if isinstance(text, bytes) else json.dumps(text).encode(), data, length)
    with pytest.raises(dsaio.CheckpointError, match=words):
        dsaio.load(path)


def test_metadata_is_covered_by_a_checksum(tmp_path):
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.arange(10.0)}, path, metadata={"lr": "0.01", "step": "2"})
    header, data = split(path)
    header["__metadata__"]["lr"] = "0.05"  # one flipped digit, the kind of change a bad disk makes
    join(path, header, data)
    with pytest.raises(dsaio.CheckpointError, match=r"dsaio\.metadata_crc32"):
        dsaio.load(path)
    assert dsaio.load_with_metadata(path, verify=False)[1]["lr"] == "0.05"  # on request, unchecked


def test_deleting_every_checksum_does_not_turn_verification_off(tmp_path):
    path = state_file(tmp_path / "s.safetensors")
    header, data = split(path)
    for key in ("dsaio.crc32", "dsaio.index_crc32", "dsaio.metadata_crc32", "dsaio.chunk"):
        del header["__metadata__"][key]
    join(path, header, data)
    with pytest.raises(dsaio.CheckpointError, match="missing"):
        dsaio.load_state_dict(path)
    assert dsaio.load_state_dict(path, verify=False)["tag"] == "run-1"  # the caller may still choose to


def test_a_foreign_file_without_dsaio_metadata_still_loads(tmp_path):
    """safetensors files from other writers carry no checksums: there is nothing to verify."""
    path = state_file(tmp_path / "s.safetensors")
    header, data = split(path)
    header["__metadata__"] = {"format": "np"}
    join(path, header, data)
    assert dsaio.load(path)["model.w"].shape == (3, 4)
    with pytest.raises(dsaio.CheckpointError, match="not a state-dict"):
        dsaio.load_state_dict(path)


def test_stored_framework_needs_what_is_installed(tmp_path):
    """A file saying "np" but holding bf16 is inconsistent (numpy has no bf16): refused, not a TypeError."""
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.arange(4, dtype=np.float32)}, path)
    header, data = split(path)
    header["x"]["dtype"], header["x"]["shape"] = "BF16", [8]
    join(path, resign(header), data)
    with pytest.raises(dsaio.CheckpointError, match="BF16"):
        dsaio.load(path)
    with pytest.raises(TypeError, match="framework='pt'"):  # the caller asked for numpy: the caller's error
        dsaio.load(path, framework="np")


def test_state_nesting_is_bounded_when_saving(tmp_path):
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValueError, match="nested"):
        dsaio.save_state_dict({"x": deep}, tmp_path / "s.safetensors")
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nested"):
        dsaio.save_state_dict({"x": loop}, tmp_path / "s.safetensors")
    assert not list(tmp_path.iterdir())


def test_valid_files_still_load_everywhere(tmp_path):
    """The checks refuse nothing that dsaio or safetensors writes."""
    path = state_file(tmp_path / "s.safetensors")
    back = dsaio.load_state_dict(path)
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999) and back["empty"].shape == (0, 4)
    stn = pytest.importorskip("safetensors.numpy")
    assert stn.load_file(str(path))["model.w"].shape == (3, 4)
    stn.save_file({"a": np.ones((2, 0, 3), np.float32), "b": np.arange(3, dtype=np.uint16)}, str(tmp_path / "t"))
    assert dsaio.load(tmp_path / "t")["a"].shape == (2, 0, 3)
