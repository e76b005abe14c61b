"""Fuzzing the header of a valid state file: whatever is changed, loading either succeeds or raises
CheckpointError, never another exception. Half the cases recompute the index and metadata checksums
after the change, as a forger would, so the reader's own field checks are what is exercised."""

from __future__ import annotations

import json
import os

import pytest
from _headers import join, resign, split, state_file

import dsaio

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

EXAMPLES = int(os.environ.get("DSAIO_FUZZ_EXAMPLES", "300"))
NAMES = ["dtype", "shape", "data_offsets", "__metadata__", "dsaio.format", "dsaio.chunk", "dsaio.crc32",
         "dsaio.framework", "dsaio.state", "__dict__", "__tensor__", "__tuple__", "__float__", "__set__",
         "__frozenset__", "__bytes__", "__namespace__", "__torch_dtype__", "__torch_device__", "model.w"]
SPECIAL = [2**63, 2**63 - 1, 2**64, -1, 0, 1, 10**30, -(2**63), 4096, 1 << 26, "F32", "BF16", "F8_E4M3", "U8",
           "pt", "np", "inf", "nan", "-inf", "", "0" * 8, "float32", "cpu", "model.w", 0.5, 1e308, True, False]
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12) | st.sampled_from(SPECIAL))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8), inner, max_size=4),
                      max_leaves=10)


def _container_path(data, root: object) -> list[object]:
    """Keys from the root down to some node that is a non-empty dict or list."""
    keys, node = [], root
    while isinstance(node, (dict, list)) and node:
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        if not isinstance(node[key], (dict, list)) or not node[key] or not data.draw(st.booleans()):
            return [*keys, key]
        keys.append(key)
        node = node[key]
    return keys


def _change_tree(data, root: object) -> object:
    """Replaces, deletes or adds one node anywhere in a JSON tree."""
    if not isinstance(root, (dict, list)) or not root:
        return data.draw(values)
    keys = _container_path(data, root)
    parent = root
    for k in keys[:-1]:
        parent = parent[k]
    what = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if what == "replace":
        parent[keys[-1]] = data.draw(values)
    elif what == "delete":
        del parent[keys[-1]]
    elif isinstance(parent, dict):
        parent[data.draw(st.sampled_from(NAMES) | st.text(max_size=8))] = data.draw(values)
    else:
        parent.insert(data.draw(st.integers(0, len(parent))), data.draw(values))
    return root


def _change_bytes(data, text: bytes) -> bytes:
    where = data.draw(st.integers(0, max(len(text) - 1, 0)))
    what = data.draw(st.sampled_from(["flip", "set", "insert", "delete"]))
    if what == "flip":
        return text[:where] + bytes([text[where] ^ (1 << data.draw(st.integers(0, 7)))]) + text[where + 1 :]
    byte = bytes([data.draw(st.integers(0, 255))])
    if what == "set":
        return text[:where] + byte + text[where + 1 :]
    if what == "insert":
        return text[:where] + byte + text[where:]
    return text[:where] + text[where + 1 :]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = state_file(tmp_path_factory.mktemp("fuzz") / "base.safetensors")
    return path, path.read_bytes()


@hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(data=st.data())
def test_any_header_change_fails_only_with_checkpoint_error(original, data):
    base, raw = original
    path = base.with_name("fuzzed.safetensors")
    path.write_bytes(raw)
    header, body = split(path)
    length = None
    kind = data.draw(st.sampled_from(["tree", "state", "bytes", "length", "size", "two"]))
    for step in ([kind] if kind != "two" else ["tree", "state"]):
        if step == "tree":
            header = _change_tree(data, header)
        elif step == "state" and isinstance(header, dict) and isinstance(header.get("__metadata__"), dict):
            meta = header["__metadata__"]
            try:
                skeleton = json.loads(meta.get("dsaio.state"))
            except (TypeError, ValueError):  # the tree step already broke it
                continue
            meta["dsaio.state"] = json.dumps(_change_tree(data, skeleton))
    if data.draw(st.booleans()):
        header = resign(header)
    text = json.dumps(header).encode()
    if kind == "bytes":
        text = _change_bytes(data, text)
    elif kind == "length":
        length = data.draw(st.integers(0, 2**64 - 1) | st.integers(len(text) - 16, len(text) + 16).filter(lambda n: n >= 0))
    elif kind == "size":
        body = body[: data.draw(st.integers(0, len(body)))] + b"\0" * data.draw(st.integers(0, 64))
    join(path, text, body, length)
    for load in (dsaio.load_state_dict, dsaio.load, lambda p: dsaio.load(p, verify=False)):
        try:
            load(path)
        except dsaio.CheckpointError as exc:
            assert exc.filename == str(path)
