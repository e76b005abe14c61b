"""The closed set of values a state file holds: each declared type round-trips, anything else is refused
when saving (naming where it sits), and a crafted skeleton cannot make loading run code."""

from __future__ import annotations

import argparse
import json
import struct

import numpy as np
import pytest

import dsaio


def test_declared_types_round_trip(tmp_path):
    state = {"args": argparse.Namespace(lr=0.1, layers=[1, 2], name="run"), "seen": {3, 1, 2},
             "frozen": frozenset({"a", "b"}), "raw": b"\x00\xffdata", "nested": (1, 2.5, None, True),
             "array": np.arange(4, dtype=np.int32), "scalar": np.float32(1.5), 7: "int key", "inf": float("inf")}
    path = tmp_path / "state.safetensors"
    dsaio.save_state_dict(state, path)
    back = dsaio.load_state_dict(path)
    assert back["args"] == state["args"] and isinstance(back["args"], argparse.Namespace)
    assert back["seen"] == {1, 2, 3} and isinstance(back["seen"], set)
    assert back["frozen"] == frozenset({"a", "b"}) and isinstance(back["frozen"], frozenset)
    assert back["raw"] == b"\x00\xffdata"
    assert back["nested"] == (1, 2.5, None, True)
    assert np.array_equal(back["array"], state["array"])
    assert back["scalar"] == 1.5 and back[7] == "int key" and back["inf"] == float("inf")


def test_torch_values_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    state = {"dtype": torch.bfloat16, "device": torch.device("cpu"), "shape": torch.Size([2, 3]),
             "ns": argparse.Namespace(weight=torch.ones(2))}
    path = tmp_path / "state.safetensors"
    dsaio.save_state_dict(state, path)
    back = dsaio.load_state_dict(path)
    assert back["dtype"] is torch.bfloat16 and back["device"] == torch.device("cpu")
    assert tuple(back["shape"]) == (2, 3) and torch.equal(back["ns"].weight, torch.ones(2))


class _OwnClass:
    pass


@pytest.mark.parametrize("value", [_OwnClass(), lambda: 0, object(), complex(1, 2)])
def test_other_values_are_refused_naming_where(tmp_path, value):
    path = tmp_path / "state.safetensors"
    with pytest.raises(TypeError, match=r"'client\.items\.1'.*nothing is pickled"):
        dsaio.save_state_dict({"client": {"items": [1, value]}}, path)
    with pytest.raises(TypeError, match=r"'client\.items\.1'"):
        dsaio.check_state_dict({"client": {"items": [1, value]}})
    assert not path.exists()


def _rewrite_skeleton(path, skeleton: object) -> None:
    """Replace the state skeleton in the file's header (the data checksums stay valid)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header["__metadata__"]["dsaio.state"] = json.dumps(skeleton)
    text = json.dumps(header).encode()
    text += b" " * ((-len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])


@pytest.mark.parametrize("node", [{"__torch_dtype__": "load"}, {"__torch_dtype__": "__import__"},
                                  {"__bytes__": "zz"}, {"__namespace__": [1, 2]}, {"__pickle__": "x"},
                                  {"__torch_device__": "not a device"}])
def test_crafted_skeleton_is_refused_not_run(tmp_path, node):
    pytest.importorskip("torch")
    path = tmp_path / "state.safetensors"
    dsaio.save_state_dict({"x": 1}, path)
    _rewrite_skeleton(path, node)
    with pytest.raises(dsaio.CheckpointError):
        dsaio.load_state_dict(path, verify=False)  # the header is ours to forge: only the skeleton is tested here


def test_a_state_file_carries_the_callers_metadata_readable_from_its_header_alone(tmp_path):
    path = tmp_path / "state.safetensors"
    dsaio.save_state_dict({"step": 3, "w": np.ones(4)}, path, metadata={"record": '{"step": 3}'})
    assert dsaio.read_metadata(path) == {"record": '{"step": 3}'}  # dsaio's own entries are not the caller's
    assert dsaio.load_state_dict(path)["step"] == 3
    dsaio.save({"w": np.ones(2)}, tmp_path / "flat.safetensors", metadata={"kind": "flat"})
    assert dsaio.read_metadata(tmp_path / "flat.safetensors") == {"kind": "flat"}
    with pytest.raises(ValueError, match="reserved"):
        dsaio.save_state_dict({}, path, metadata={"dsaio.state": "{}"})
    with pytest.raises(TypeError, match="str to str"):
        dsaio.save_state_dict({}, path, metadata={"record": 3})


def test_read_metadata_checks_the_header_it_reads(tmp_path):
    path = tmp_path / "state.safetensors"
    dsaio.save_state_dict({"w": np.ones(4)}, path, metadata={"record": "mine"})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"mine")
    raw[at:at + 4] = b"yours"[:4]  # same length: only dsaio's metadata checksum can tell
    path.write_bytes(bytes(raw))
    with pytest.raises(dsaio.CheckpointError, match="metadata"):
        dsaio.read_metadata(path)
    path.write_bytes(bytes(raw[:20]))
    with pytest.raises(dsaio.CheckpointError, match="truncated"):
        dsaio.read_metadata(path)
