"""Checkpoint files: round trips, safetensors both ways, refusal of damaged files, atomicity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dsaio

NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.float16, np.int32, np.uint32, np.float32,
             np.float64, np.int64, np.uint64, np.complex64]


def _arrays():
    rng = np.random.default_rng(0)
    out = {f"a_{np.dtype(dt).name}": (rng.random((3, 5)) * 100).astype(dt) for dt in NP_DTYPES}
    out["odd"] = rng.integers(0, 255, 4097, dtype=np.uint8)
    out["empty"] = np.empty((0, 3), np.float32)
    out["scalar"] = np.array(2.5)
    return out


def test_numpy_roundtrip_and_metadata(tmp_path):
    arrays = _arrays()
    path = tmp_path / "c.safetensors"
    dsaio.save(arrays, path, metadata={"step": "10"})
    back, meta = dsaio.load_with_metadata(path)
    assert meta == {"step": "10"}
    assert sorted(back) == sorted(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v), k
    # Data starts on a 4096-byte boundary so one O_DIRECT read loads it.
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_len) % 4096 == 0


def test_torch_roundtrip_all_dtypes(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = {str(dt): torch.arange(24).reshape(2, 3, 4).to(dt) for dt in
               (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8,
                torch.float8_e4m3fn, torch.float64)}
    tensors["strided"] = torch.randn(6, 4).t()  # saved as its contiguous copy
    dsaio.save(tensors, tmp_path / "c.safetensors")
    back = dsaio.load(tmp_path / "c.safetensors")
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k].float(), v.float()), k
    with pytest.raises(TypeError, match="framework='pt'"):
        dsaio.load(tmp_path / "c.safetensors", framework="np")


def test_safetensors_reads_ours_and_we_read_theirs(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(33, 7), "b": torch.randn(7).half(), "i": torch.arange(5, dtype=torch.int32),
               "bf": torch.randn(9).bfloat16()}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    dsaio.save(tensors, ours, metadata={"format": "pt"})
    got = st.load_file(str(ours))
    assert all(torch.equal(got[k], tensors[k]) for k in tensors)
    st.save_file(tensors, str(theirs), metadata={"format": "pt"})
    back = dsaio.load(theirs)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_safetensors_numpy_reads_ours(tmp_path):
    stn = pytest.importorskip("safetensors.numpy")
    arrays = {"x": np.arange(100, dtype=np.float32), "y": np.ones((2, 2), np.int64)}
    dsaio.save(arrays, tmp_path / "c.safetensors")
    got = stn.load_file(str(tmp_path / "c.safetensors"))
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)


def test_truncated_file_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.arange(10_000, dtype=np.float64)}, path)
    size = path.stat().st_size
    for cut in (size - 1, size - 5000, 4096, 100, 3):
        os.truncate(path, cut)
        with pytest.raises(dsaio.CheckpointError, match="truncated") as info:
            dsaio.load(path)
        assert info.value.filename == str(path)


def test_corrupted_data_is_refused_by_checksum(tmp_path):
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.arange(10_000, dtype=np.float64)}, path)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(dsaio.CheckpointError, match="checksum mismatch"):
        dsaio.load(path)
    assert dsaio.load(path, verify=False)["x"].shape == (10_000,)


def test_corrupted_header_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.arange(10, dtype=np.float64)}, path)
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"shape":[10]') + 9] = ord("9")  # shape [90]: offsets no longer match
    path.write_bytes(bytes(raw))
    with pytest.raises(dsaio.CheckpointError, match="corrupted header"):
        dsaio.load(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(dsaio.CheckpointError, match="not valid JSON"):
        dsaio.load(path)


def test_state_dict_with_optimizer_state(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7, "tag": "run-1",
             "loss": 0.25, "best": float("inf"), "pair": (1, "a"), "none": None, "dtype": torch.bfloat16,
             "np": np.arange(3)}
    dsaio.save_state_dict(state, tmp_path / "s.safetensors")
    back = dsaio.load_state_dict(tmp_path / "s.safetensors")
    assert back["step"] == 7 and back["tag"] == "run-1" and back["loss"] == 0.25 and back["best"] == float("inf")
    assert back["pair"] == (1, "a") and back["none"] is None and back["dtype"] is torch.bfloat16
    assert list(back["optimizer"]["state"]) == [0, 1]  # int keys stay ints
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    model2 = torch.nn.Linear(4, 3)
    model2.load_state_dict(back["model"])
    opt2 = torch.optim.AdamW(model2.parameters())
    opt2.load_state_dict(back["optimizer"])
    with pytest.raises(dsaio.CheckpointError, match="not a state-dict"):
        dsaio.save({"x": torch.ones(1)}, tmp_path / "flat.safetensors")
        dsaio.load_state_dict(tmp_path / "flat.safetensors")


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        dsaio.save({"x": np.ones(1)}, tmp_path / "c", metadata={"dsaio.crc32": "x"})
    with pytest.raises(TypeError, match="'x'"):
        dsaio.save({"x": [1, 2]}, tmp_path / "c")
    with pytest.raises(TypeError, match="save_state_dict"):
        dsaio.save([np.ones(1)], tmp_path / "c")
    with pytest.raises(TypeError, match="complex"):  # sets are state values now; complex numbers are not
        dsaio.save_state_dict({"s": 1j}, tmp_path / "c")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


_SAVER = textwrap.dedent("""
    import sys, numpy as np, dsaio
    path, i = sys.argv[1], 0
    big = np.full(48 << 20, 0, np.uint8)
    print("ready", flush=True)
    while True:
        i += 1
        big[:] = i % 256
        dsaio.save({"x": big, "i": np.array([i])}, path)
""")


def test_sigkill_during_save_leaves_previous_file_whole(tmp_path):
    path = tmp_path / "c.safetensors"
    dsaio.save({"x": np.full(48 << 20, 0, np.uint8), "i": np.array([0])}, path)
    for delay in (0.15, 0.4, 0.7):
        child = subprocess.Popen([sys.executable, "-c", _SAVER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(delay)  # somewhere inside a save (each takes a fraction of a second)
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait(timeout=30)
        back = dsaio.load(path)  # checksums verified: whole, never a mix of two saves
        assert np.all(back["x"] == back["i"][0] % 256)
